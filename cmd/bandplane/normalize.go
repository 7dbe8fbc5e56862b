package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/bandplane/bandplane/schema"
)

func init() {
	register("normalize", "convert platform frames or canonical events to canonical NDJSON", runNormalize)
}

// maxLineBytes is the longest input line normalize reads; longer ones are reported and
// skipped.
const maxLineBytes = 64 << 20

// runNormalize is `bandplane normalize [FILE…]`: it reads NDJSON lines, each a platform
// frame or a canonical event, from the files (stdin when there are none, or for "-") and
// writes each as one canonical JSON event a line. An invalid line is reported on stderr
// as `line N: <reason>` (`FILE:line N: <reason>` when there are several files) and the
// rest still go through; the exit status is then 1. Blank lines are skipped. A frame
// that carries no time of its own gets the time it is read. Frame ids are in the
// platform's writer scope (schema.PlatformWriter): the ids ingest gives the frames when
// the platform posts them or produces them to Kafka directly; an organization's key
// posting the same frames gets ids of its own.
func runNormalize(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("normalize", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintln(e.stderr, "usage: bandplane normalize [FILE…]\n\n"+
			"Reads platform frames or canonical events, one JSON object a line, from the files\n"+
			"(or stdin when none is given, or for \"-\") and writes canonical events as NDJSON to\n"+
			"stdout. Invalid lines are reported on stderr; the exit status is then 1.\n\n"+
			"A frame's id is a hash of the frame in its writer's scope; normalize writes the\n"+
			"platform's: the ids the frames get when posted with a platform key or produced to\n"+
			"Kafka directly. Posted with an organization's key, the same frames get other ids.")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return exitError{code: 2}
	}
	files := fs.Args()
	if len(files) == 0 {
		files = []string{"-"}
	}
	out := bufio.NewWriterSize(e.stdout, 64<<10)
	n := &normalizer{out: out, stderr: e.stderr, prefix: len(files) > 1}
	var runErr error
	for _, name := range files {
		if err := ctx.Err(); err != nil {
			runErr = err
			break
		}
		if err := n.file(ctx, name, e.stdin); err != nil {
			if ctx.Err() != nil {
				runErr = ctx.Err()
				break
			}
			fmt.Fprintf(e.stderr, "%s: %v\n", name, err)
			n.invalid = true
		}
	}
	if err := out.Flush(); err != nil && runErr == nil {
		runErr = fmt.Errorf("writing output: %w", err)
	}
	if runErr != nil {
		return runErr
	}
	if n.invalid {
		return exitError{code: 1}
	}
	return nil
}

type normalizer struct {
	out     *bufio.Writer
	stderr  io.Writer
	prefix  bool // name the file in reports
	invalid bool
}

func (n *normalizer) file(ctx context.Context, name string, stdin io.Reader) error {
	var r io.Reader
	if name == "-" {
		r = stdin
	} else {
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		r = f
	}
	br := bufio.NewReaderSize(r, 1<<20)
	var long []byte
	for lineNo := 1; ; lineNo++ {
		if lineNo%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		line, tooLong, err := readLine(br, &long)
		if len(line) > 0 || tooLong {
			n.line(name, lineNo, line, tooLong)
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// readLine reads one line without its end; a line longer than maxLineBytes is consumed
// and reported tooLong. buf is reused across calls for lines longer than the reader's
// buffer.
func readLine(br *bufio.Reader, buf *[]byte) (line []byte, tooLong bool, err error) {
	chunk, err := br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		*buf = append((*buf)[:0], chunk...)
		for errors.Is(err, bufio.ErrBufferFull) {
			chunk, err = br.ReadSlice('\n')
			if !tooLong {
				if len(*buf)+len(chunk) > maxLineBytes {
					tooLong = true
					*buf = (*buf)[:0]
				} else {
					*buf = append(*buf, chunk...)
				}
			}
		}
		chunk = *buf
	}
	if tooLong {
		return nil, true, err
	}
	return bytes.TrimSpace(chunk), false, err
}

func (n *normalizer) line(name string, lineNo int, line []byte, tooLong bool) {
	if tooLong {
		n.report(name, lineNo, fmt.Errorf("line longer than %d bytes", maxLineBytes))
		return
	}
	ev, err := schema.Decode(line)
	if err != nil {
		n.report(name, lineNo, err)
		return
	}
	b, err := json.Marshal(ev)
	if err != nil {
		n.report(name, lineNo, err)
		return
	}
	_, _ = n.out.Write(b) // a failed write shows at the Flush that ends the run
	_ = n.out.WriteByte('\n')
}

func (n *normalizer) report(name string, lineNo int, err error) {
	n.invalid = true
	if n.prefix {
		fmt.Fprintf(n.stderr, "%s:line %d: %v\n", name, lineNo, err)
		return
	}
	fmt.Fprintf(n.stderr, "line %d: %v\n", lineNo, err)
}
