// Package unwindmapstest has a fake of the BPF maps unwindmaps writes, for
// the tests of unwindmaps and its users.
package unwindmapstest

import (
	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/support"
)

// Maps records what unwindmaps writes to the BPF maps, in maps a test
// reads directly.
type Maps struct {
	Rules    map[uint16]support.UnwindRule
	Deltas   map[uint32]support.StackDelta
	Pages    map[support.DeltaPageKey]support.DeltaPage
	Mappings map[support.PidMappingKey]support.PidMapping
	Known    map[support.FileKey]support.KnownFile
	Runtimes map[support.RuntimeProcKey]any
}

// NewMaps returns empty maps.
func NewMaps() *Maps {
	return &Maps{
		Rules:    map[uint16]support.UnwindRule{},
		Deltas:   map[uint32]support.StackDelta{},
		Pages:    map[support.DeltaPageKey]support.DeltaPage{},
		Mappings: map[support.PidMappingKey]support.PidMapping{},
		Known:    map[support.FileKey]support.KnownFile{},
		Runtimes: map[support.RuntimeProcKey]any{},
	}
}

func (f *Maps) SetRuntimeConfig(pid uint32, id interpreter.ID, v any) error {
	f.Runtimes[support.RuntimeProcKey{PID: pid, Runtime: uint32(id)}] = v
	return nil
}

func (f *Maps) DeleteRuntimeConfig(pid uint32, id interpreter.ID) error {
	delete(f.Runtimes, support.RuntimeProcKey{PID: pid, Runtime: uint32(id)})
	return nil
}

func (f *Maps) SetUnwindRule(id uint16, r support.UnwindRule) error {
	f.Rules[id] = r
	return nil
}

func (f *Maps) SetStackDeltas(first uint32, d []support.StackDelta) error {
	for i, x := range d {
		f.Deltas[first+uint32(i)] = x
	}
	return nil
}

func (f *Maps) SetDeltaPage(k support.DeltaPageKey, v support.DeltaPage) error {
	f.Pages[k] = v
	return nil
}

func (f *Maps) DeleteDeltaPage(k support.DeltaPageKey) error {
	delete(f.Pages, k)
	return nil
}

func (f *Maps) SetPidMapping(k support.PidMappingKey, v support.PidMapping) error {
	f.Mappings[k] = v
	return nil
}

func (f *Maps) DeletePidMapping(k support.PidMappingKey) error {
	delete(f.Mappings, k)
	return nil
}

func (f *Maps) SetKnownFile(k support.FileKey, v support.KnownFile) error {
	f.Known[k] = v
	return nil
}

func (f *Maps) DeleteKnownFile(k support.FileKey) error {
	delete(f.Known, k)
	return nil
}

// BPFLookup does what the BPF unwinder does with the maps.
func (f *Maps) BPFLookup(fileID, addr uint64, pageBits uint) (support.UnwindRule, bool) {
	page, ok := f.Pages[support.DeltaPageKey{FileID: fileID, Page: addr >> pageBits}]
	if !ok {
		return support.UnwindRule{}, false
	}
	low := uint16(addr & (1<<pageBits - 1))
	var rule uint16
	for i := page.First; i < page.First+page.Count; i++ {
		if f.Deltas[i].AddrLow > low {
			break
		}
		rule = f.Deltas[i].Rule
	}
	return f.Rules[rule], true
}
