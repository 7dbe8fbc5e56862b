package loadbench

import (
	"bufio"
	"bytes"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuSample is the CPU time used so far by the server process, the hostile one (when
// there is one), this one and the machine: on a shared 2-core machine a phase's
// latencies mean little without who was busy meanwhile.
type cpuSample struct {
	at                  time.Time
	serverPID, hostPID  int
	server, hostile     time.Duration
	serverOK, hostileOK bool
	self                time.Duration
	busy, total         uint64 // /proc/stat jiffies of all CPUs
	machineOK           bool
}

func sampleCPU(serverPID, hostilePID int) cpuSample {
	s := cpuSample{at: time.Now(), serverPID: serverPID, hostPID: hostilePID}
	s.server, s.serverOK = processCPU(serverPID)
	s.hostile, s.hostileOK = processCPU(hostilePID)
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	s.busy, s.total, s.machineOK = machineJiffies()
	return s
}

// cpuUse is cores used on average between two samples.
type cpuUse struct {
	server, hostile, self, machine float64
}

// cores is the use between s and now; a figure that cannot be read is 0.
func (s cpuSample) cores() cpuUse {
	now := sampleCPU(s.serverPID, s.hostPID)
	wall := now.at.Sub(s.at).Seconds()
	var u cpuUse
	if wall <= 0 {
		return u
	}
	if s.serverOK && now.serverOK {
		u.server = round((now.server-s.server).Seconds()/wall, 2)
	}
	if s.hostileOK && now.hostileOK {
		u.hostile = round((now.hostile-s.hostile).Seconds()/wall, 2)
	}
	u.self = round((now.self-s.self).Seconds()/wall, 2)
	if s.machineOK && now.machineOK && now.total > s.total {
		u.machine = round(float64(now.busy-s.busy)/float64(now.total-s.total)*float64(runtime.NumCPU()), 2)
	}
	return u
}

// machineJiffies reads the first line of /proc/stat: busy (user, nice, system, irq,
// softirq) and total (those, idle, iowait and steal) time of all CPUs.
func machineJiffies() (busy, total uint64, ok bool) {
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

// processCPU reads the user and system time of process pid from /proc/<pid>/stat.
func processCPU(pid int) (time.Duration, bool) {
	if pid <= 0 {
		return 0, false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	return parseProcStat(b)
}

// parseProcStat reads utime and stime (fields 14 and 15) of a /proc/<pid>/stat line.
// The command name (field 2) is in parentheses and may hold spaces and parentheses
// itself: the fields are counted from the last ')'.
func parseProcStat(b []byte) (time.Duration, bool) {
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
