// Package cpustat reads how busy the machine and a process were, from /proc: what the
// benchmarks report beside their figures, so that a noisy 2-core machine's share of
// the noise shows.
//
// It may import any folder but cmd/ (deploy/layers); it needs the standard library only.
package cpustat

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
	"time"
)

// MachineJiffies reads the first line of /proc/stat: busy (user, nice, system, irq,
// softirq) and total (those, idle, iowait and steal) time of all CPUs.
func MachineJiffies() (busy, total uint64, ok bool) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	defer f.Close() //nolint:errcheck // read only
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		return 0, 0, false
	}
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		return 0, 0, false
	}
	var v [8]uint64
	for i := range v {
		if v[i], err = strconv.ParseUint(fields[i+1], 10, 64); err != nil {
			return 0, 0, false
		}
	}
	user, nice, system, idle, iowait, irq, softirq, steal := v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]
	busy = user + nice + system + irq + softirq
	return busy, busy + idle + iowait + steal, true
}

// clockTicks is the unit of /proc/<pid>/stat's times (USER_HZ, 100 on every Linux
// architecture Go runs on).
const clockTicks = 100

// ProcessCPU reads the user and system time of process pid from /proc/<pid>/stat.
func ProcessCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	return ParseProcStat(b)
}

// ParseProcStat reads utime and stime (fields 14 and 15) of a /proc/<pid>/stat line.
// The command name (field 2) is in parentheses and may hold spaces and parentheses
// itself: the fields are counted from the last ')'.
func ParseProcStat(b []byte) (time.Duration, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3, the state
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, true
}
