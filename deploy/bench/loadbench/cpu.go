package loadbench

import (
	"runtime"
	"syscall"
	"time"

	"github.com/bandplane/bandplane/deploy/bench/cpustat"
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
	s.server, s.serverOK = cpustat.ProcessCPU(serverPID)
	s.hostile, s.hostileOK = cpustat.ProcessCPU(hostilePID)
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	s.busy, s.total, s.machineOK = cpustat.MachineJiffies()
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
