// Command stackdeltas prints the stack deltas nativeunwind extracts from an
// ELF file: one line per delta (address range and rule), then a summary of
// the rules by kind and of what could not be expressed. With -addr it
// prints only the rule for one address.
//
// Usage: go run ./utils/stackdeltas [-addr 0x1234] FILE
package main

import (
	"debug/elf"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/hostprof/ebpf-profiler/nativeunwind"
)

func main() {
	addr := flag.String("addr", "", "print only the rule for this address (hex with 0x, or decimal)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: stackdeltas [-addr ADDRESS] FILE\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	path := flag.Arg(0)
	f, err := elf.Open(path)
	if err != nil {
		fatalf("%v", err)
	}
	defer f.Close()
	t0 := time.Now()
	d, st, err := nativeunwind.ExtractWithStats(f)
	took := time.Since(t0)
	if err != nil {
		fatalf("%s: %v", path, err)
	}
	if *addr != "" {
		a, err := strconv.ParseUint(*addr, 0, 64)
		if err != nil {
			fatalf("bad address %q", *addr)
		}
		printAddr(d, a)
		return
	}
	for i, x := range d {
		end := "..."
		if i+1 < len(d) {
			end = fmt.Sprintf("%#x", d[i+1].Address)
		}
		fmt.Printf("%#x-%s %v\n", x.Address, end, x.Rule)
	}
	summary(d, st, took)
}

func printAddr(d nativeunwind.Deltas, a uint64) {
	i, _ := slices.BinarySearchFunc(d, a, func(x nativeunwind.Delta, a uint64) int {
		switch {
		case x.Address < a:
			return -1
		case x.Address > a:
			return 1
		}
		return 0
	})
	if i < len(d) && d[i].Address == a {
		i++
	}
	if i == 0 {
		fmt.Printf("%#x: no delta\n", a)
		return
	}
	end := "..."
	if i < len(d) {
		end = fmt.Sprintf("%#x", d[i].Address)
	}
	fmt.Printf("%#x: %v (delta %#x-%s)\n", a, d[i-1].Rule, d[i-1].Address, end)
}

func summary(d nativeunwind.Deltas, st nativeunwind.Stats, took time.Duration) {
	perKind := map[nativeunwind.CFABase]int{}
	var unknownRanges int
	var unknownBytes uint64
	for i, x := range d {
		perKind[x.Rule.CFA]++
		if x.Rule.CFA == nativeunwind.CFAUnknown && i+1 < len(d) {
			unknownRanges++
			unknownBytes += d[i+1].Address - x.Address
		}
	}
	fmt.Printf("\n%d deltas in %v\n", len(d), took.Round(time.Microsecond))
	for k := nativeunwind.CFAUnknown; k <= nativeunwind.CFAGoCgo; k++ {
		fmt.Printf("  %-8s %d\n", k, perKind[k])
	}
	fmt.Printf("unknown ranges between the first and last delta: %d, %d bytes\n", unknownRanges, unknownBytes)
	fmt.Printf("CIEs %d, FDEs %d (skipped %d, overlapping %d), CFA rows %d\n",
		st.CIEs, st.FDEs, st.SkippedFDEs, st.Overlaps, st.Rows)
	for _, why := range slices.Sorted(maps.Keys(st.Unsupported)) {
		fmt.Printf("rows mapped to unknown: %s: %d\n", why, st.Unsupported[why])
	}
	if len(st.StopSymbols) > 0 {
		fmt.Printf("entry point symbols: %v\n", st.StopSymbols)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "stackdeltas: "+format+"\n", args...)
	os.Exit(1)
}
