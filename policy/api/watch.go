package api

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// Watch reloads the policy folder when a file in it changes (name, size or mtime),
// checking every interval, until ctx ends. A bundle that fails to compile or whose tests
// fail is refused (logged) and the previous revision keeps serving. It polls instead of
// using inotify: one stat per file every few seconds, and no dependency.
func (a *API) Watch(ctx context.Context, interval time.Duration) {
	if a.cfg.BundleDir == "" {
		return
	}
	last, err := folderStamp(a.cfg.BundleDir)
	if err != nil {
		a.log.Warn("cannot watch the policy folder", "dir", a.cfg.BundleDir, "err", err)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur, err := folderStamp(a.cfg.BundleDir)
		if err != nil || cur == last {
			continue
		}
		last = cur
		_, _ = a.Reload(ctx) // logs its outcome
	}
}

func folderStamp(dir string) (string, error) {
	var lines []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := os.Stat(path)
		if err != nil {
			return err
		}
		lines = append(lines, fmt.Sprintf("%s %d %d", path, info.Size(), info.ModTime().UnixNano()))
		return nil
	})
	sort.Strings(lines)
	h := sha256.New()
	for _, l := range lines {
		h.Write([]byte(l + "\n"))
	}
	return fmt.Sprintf("%x", h.Sum(nil)), err
}
