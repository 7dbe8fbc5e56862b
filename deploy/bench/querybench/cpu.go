package querybench

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPUUse is how busy the machine was during a phase, in cores (averaged): this process
// (server and load generator alike) and the whole machine (ClickHouse, Kafka and
// whatever else runs there; 0 when /proc/stat cannot be read). On a shared 2-core
// machine the difference says how much of the noise is somebody else's.
type CPUUse struct {
	Self, Machine float64
}

// cpuSample is the CPU time used so far by this process and by the machine.
type cpuSample struct {
	at           time.Time
	self         time.Duration
	busy, total  uint64 // /proc/stat jiffies of all CPUs
	machineKnown bool
}

func sampleCPU() cpuSample {
	s := cpuSample{at: time.Now()}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	s.busy, s.total, s.machineKnown = machineJiffies()
	return s
}

// since is the use between s and now.
func (s cpuSample) since() CPUUse {
	now := sampleCPU()
	wall := now.at.Sub(s.at).Seconds()
	if wall <= 0 {
		return CPUUse{}
	}
	u := CPUUse{Self: round((now.self-s.self).Seconds()/wall, 2)}
	if s.machineKnown && now.machineKnown && now.total > s.total {
		u.Machine = round(float64(now.busy-s.busy)/float64(now.total-s.total)*float64(runtime.NumCPU()), 2)
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
