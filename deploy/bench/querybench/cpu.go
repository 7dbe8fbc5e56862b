package querybench

import (
	"runtime"
	"syscall"
	"time"

	"github.com/bandplane/bandplane/deploy/bench/cpustat"
)

// CPUUse is how busy the machine was during a phase, in cores (averaged): this process
// (the server, and during the reads their client too; during the live phase the live
// reader, hub and producer with it), the subscribers' process (live phase only) and
// the whole machine (ClickHouse, Kafka and whatever else runs there; 0 when /proc/stat
// cannot be read). On a shared 2-core machine the difference says how much of the
// noise is somebody else's.
type CPUUse struct {
	Self, Subscribers, Machine float64
}

// cpuSample is the CPU time used so far by this process, by another one (pid, when
// not 0) and by the machine.
type cpuSample struct {
	at           time.Time
	self         time.Duration
	pid          int
	other        time.Duration
	otherKnown   bool
	busy, total  uint64 // /proc/stat jiffies of all CPUs
	machineKnown bool
}

func sampleCPU() cpuSample { return sampleCPUWith(0) }

// sampleCPUWith samples process pid's CPU time too.
func sampleCPUWith(pid int) cpuSample {
	s := cpuSample{at: time.Now(), pid: pid}
	if pid != 0 {
		s.other, s.otherKnown = cpustat.ProcessCPU(pid)
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	s.busy, s.total, s.machineKnown = cpustat.MachineJiffies()
	return s
}

// since is the use between s and now.
func (s cpuSample) since() CPUUse {
	now := sampleCPUWith(s.pid)
	wall := now.at.Sub(s.at).Seconds()
	if wall <= 0 {
		return CPUUse{}
	}
	u := CPUUse{Self: round((now.self-s.self).Seconds()/wall, 2)}
	if s.otherKnown && now.otherKnown {
		u.Subscribers = round((now.other-s.other).Seconds()/wall, 2)
	}
	if s.machineKnown && now.machineKnown && now.total > s.total {
		u.Machine = round(float64(now.busy-s.busy)/float64(now.total-s.total)*float64(runtime.NumCPU()), 2)
	}
	return u
}
