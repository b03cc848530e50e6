package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"

	log "github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Start-up runs code and builds data that steady state does not touch
// again: loading and verifying the BPF programs, parsing the kernel's BTF
// and kallsyms, reading every process and the ELF files of its mappings.
// Their heap is garbage by then and their code pages stay resident until
// memory runs short, which made the daemon's resident set after start-up
// depend on what it happened to load. Once start-up is over both are
// handed back.

// Idle heap is returned to the OS in the background too: one-off work
// after start-up (the debug information of a library first sampled, a
// process with a large symbol table) leaves megabytes of free heap that
// Go's scavenger hands back only slowly, and the resident set of a daemon
// doing the same work varied from 25 to 49 MiB between runs.
const (
	idleHeapCheck = 10 * time.Second
	maxIdleHeap   = 8 << 20
)

// startupMemoryLimit is the Go runtime's soft memory limit while the
// daemon starts: loading the BPF programs (the kernel's BTF), kallsyms, the
// busy processes' ELF files, stack deltas and debug information make tens
// of MiB of garbage within a second or two, and at the default pacing the
// heap doubled past what was live. The limit must stay above what is live
// then, or the collector runs without pause: at 20 MiB set-up took 2-3
// times as long. Measured on TestStartupAccuracy's host (15 busy processes
// in ten languages, a restart; peak and steady resident set): no limit
// 120-145 MiB against 77, 64 MiB 89-114 against 75-82. Once set-up read
// large sections in place (nativeunwind.WithMappedFile) what is live fell
// below 48 MiB, and 48 gave 92-94 against 83-84 with the first export
// still at 2.3-2.4 s.
const startupMemoryLimit = 48 << 20

// limitStartupMemory lowers the soft memory limit to startupMemoryLimit
// unless one lower is set, and returns what puts the previous one back.
func limitStartupMemory() (end func()) {
	prev := debug.SetMemoryLimit(-1)
	if prev <= startupMemoryLimit {
		return func() {}
	}
	debug.SetMemoryLimit(startupMemoryLimit)
	return func() { debug.SetMemoryLimit(prev) }
}

// returnIdleHeap returns free heap to the OS whenever more than maxIdleHeap
// of it is still resident, checked every idleHeapCheck until ctx ends; it
// calls dropMapped then too.
func returnIdleHeap(ctx context.Context, dropMapped func()) {
	t := time.NewTicker(idleHeapCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		dropMapped()
		if idleHeap() > maxIdleHeap {
			debug.FreeOSMemory()
		}
	}
}

// idleHeap is the free heap still resident: free spans not returned to the
// OS.
func idleHeap() uint64 {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return sample[0].Value.Uint64()
}

// releaseStartupMemory returns free heap to the OS and drops the resident
// pages of the daemon's own read-only mappings (its code and read-only
// data): those still used come back from the page cache on first use (a
// minor fault), the rest stay out. Writable mappings (Go's data and bss,
// private copies) are left alone.
func releaseStartupMemory() {
	debug.FreeOSMemory()
	dropped, err := dropReadOnlyPages("/proc/self/maps")
	if err != nil {
		log.Debugf("Keeping the start-up code resident: %v", err)
		return
	}
	log.Debugf("Start-up over: heap returned to the OS, %d KiB of code and read-only data dropped", dropped>>10)
}

// dropReadOnlyPages drops the resident pages of the read-only mappings of
// the running executable listed in mapsPath, and returns their bytes.
func dropReadOnlyPages(mapsPath string) (uint64, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile(mapsPath)
	if err != nil {
		return 0, err
	}
	var total uint64
	s := bufio.NewScanner(bytes.NewReader(b))
	for s.Scan() {
		// start-end perms offset dev inode path
		f := strings.Fields(s.Text())
		if len(f) < 6 || f[5] != exe || len(f[1]) < 2 || f[1][1] == 'w' {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if !ok || err1 != nil || err2 != nil || end <= start {
			return total, fmt.Errorf("%s: malformed line %q", mapsPath, s.Text())
		}
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(start), uintptr(end-start), unix.MADV_DONTNEED); errno != 0 {
			return total, fmt.Errorf("madvise %s: %w", f[0], errno)
		}
		total += end - start
	}
	return total, s.Err()
}
