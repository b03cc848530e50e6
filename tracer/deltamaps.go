package tracer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"reflect"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/support"
)

// Typed writers for the maps the native unwinder reads: stack deltas and
// the per-process mapping trie. What goes into them is the process
// manager's business.

// DeltaCapacity says how big the stack-delta maps are and how they are
// laid out.
func (t *Tracer) DeltaCapacity() support.DeltaCapacity {
	return support.DeltaCapacity{
		Rules:           t.objs.UnwindRules.MaxEntries(),
		Deltas:          t.objs.StackDeltas.MaxEntries() * uint32(len(support.DeltaSlot{})),
		DeltasPerSlot:   uint32(len(support.DeltaSlot{})),
		PageBits:        t.shared.DeltaPageBits,
		FlagRASigned:    t.shared.RuleFlagRASigned,
		FlagStackSwitch: t.shared.RuleFlagStackSwitch,
	}
}

// SetUnwindRule writes rule id.
func (t *Tracer) SetUnwindRule(id uint16, r support.UnwindRule) error {
	return t.objs.UnwindRules.Put(uint32(id), r)
}

// SetStackDeltas writes deltas to the pool from delta index first on, which
// must start a slot; a last slot left half full is padded.
func (t *Tracer) SetStackDeltas(first uint32, deltas []support.StackDelta) error {
	const perSlot = uint32(len(support.DeltaSlot{}))
	if first%perSlot != 0 {
		return fmt.Errorf("stack deltas at %d do not start a slot of %d", first, perSlot)
	}
	if t.deltasMappable {
		return writeDeltas(t.objs.StackDeltas, first, deltas)
	}
	slots := make([]support.DeltaSlot, (uint32(len(deltas))+perSlot-1)/perSlot)
	keys := make([]uint32, len(slots))
	for i := range slots {
		keys[i] = first/perSlot + uint32(i)
		copy(slots[i][:], deltas[uint32(i)*perSlot:])
	}
	m := t.objs.StackDeltas
	_, err := m.BatchUpdate(keys, slots, nil)
	if !errors.Is(err, ebpf.ErrNotSupported) {
		return err
	}
	// Kernels before 5.6 have no batch operations on arrays.
	for i, s := range slots {
		if err := m.Put(keys[i], s); err != nil {
			return fmt.Errorf("stack delta slot %d: %w", keys[i], err)
		}
	}
	return nil
}

// writeDeltas writes deltas to the pool from delta index first on, as
// struct stack_delta (elements hold DELTAS_PER_SLOT of them, unpadded),
// through a mapping of the pages they span. The mapping is undone at once:
// pages it touched would count in the daemon's RSS for as long as it
// stayed, though they are the map's kernel memory either way.
func writeDeltas(pool *ebpf.Map, first uint32, deltas []support.StackDelta) error {
	const size = 4
	page := uint64(os.Getpagesize())
	poolBytes := uint64(pool.MaxEntries()) * uint64((pool.ValueSize()+7)&^7)
	off, end := uint64(first)*size, (uint64(first)+uint64(len(deltas)))*size
	if end > poolBytes {
		return fmt.Errorf("%d stack deltas at %d lie outside the pool", len(deltas), first)
	}
	if len(deltas) == 0 {
		return nil
	}
	start := off &^ (page - 1)
	mem, err := unix.Mmap(pool.FD(), int64(start), int((end-start+page-1)&^(page-1)),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mapping the stack delta pool: %w", err)
	}
	for i, d := range deltas {
		b := mem[off-start+uint64(i)*size:]
		binary.NativeEndian.PutUint16(b, d.AddrLow)
		binary.NativeEndian.PutUint16(b[2:], d.Rule)
	}
	return unix.Munmap(mem)
}

// SetDeltaPage writes the location of a page's deltas.
func (t *Tracer) SetDeltaPage(k support.DeltaPageKey, v support.DeltaPage) error {
	return t.objs.DeltaPages.Put(k, v)
}

// DeleteDeltaPage removes a page; a missing one is not an error.
func (t *Tracer) DeleteDeltaPage(k support.DeltaPageKey) error {
	return ignoreMissing(t.objs.DeltaPages.Delete(k))
}

// SetKnownFile says which loaded file the kernel's file key names.
func (t *Tracer) SetKnownFile(k support.FileKey, v support.KnownFile) error {
	return t.objs.KnownFiles.Put(k, v)
}

// SetRuntimeConfig writes what runtime id's unwinder needs of process pid:
// v is a value of the runtime's ConfigMirror type.
func (t *Tracer) SetRuntimeConfig(pid uint32, id interpreter.ID, v any) error {
	rt, ok := t.runtimes[id]
	if !ok {
		return fmt.Errorf("runtime %d has no unwinder loaded", id)
	}
	if reflect.TypeOf(v) != reflect.TypeOf(rt.ConfigMirror) {
		return fmt.Errorf("runtime %s: configuration of type %T, want %T", rt.Name, v, rt.ConfigMirror)
	}
	var buf bytes.Buffer
	if err := binary.Write(&buf, binary.NativeEndian, v); err != nil {
		return fmt.Errorf("runtime %s: encoding its configuration: %w", rt.Name, err)
	}
	var value support.RuntimeProc
	copy(value[:], buf.Bytes())
	return t.objs.RuntimeProcs.Put(support.RuntimeProcKey{PID: pid, Runtime: uint32(id)}, value)
}

// DeleteRuntimeConfig forgets a process's runtime configuration; a missing
// one is not an error.
func (t *Tracer) DeleteRuntimeConfig(pid uint32, id interpreter.ID) error {
	return ignoreMissing(t.objs.RuntimeProcs.Delete(support.RuntimeProcKey{PID: pid, Runtime: uint32(id)}))
}

// RuntimeConfigs counts the runtime configuration map's entries per pid,
// by walking it: for tests and debugging, not the sampling path.
func (t *Tracer) RuntimeConfigs() (map[uint32]int, error) {
	counts := map[uint32]int{}
	var k support.RuntimeProcKey
	var v support.RuntimeProc
	it := t.objs.RuntimeProcs.Iterate()
	for it.Next(&k, &v) {
		counts[k.PID]++
	}
	return counts, it.Err()
}

// SetAPMProc says where the APM agent of process pid keeps its threads'
// trace context.
func (t *Tracer) SetAPMProc(pid uint32, p support.APMProc) error {
	return t.objs.APMProcs.Put(pid, p)
}

// SetThreadCtxProc says where process pid keeps its threads'
// OpenTelemetry thread context pointer.
func (t *Tracer) SetThreadCtxProc(pid uint32, p support.ThreadCtxProc) error {
	return t.objs.ThreadCtxProcs.Put(pid, p)
}

// DeleteThreadCtxProc forgets a process's thread context; a missing one is
// not an error.
func (t *Tracer) DeleteThreadCtxProc(pid uint32) error {
	return ignoreMissing(t.objs.ThreadCtxProcs.Delete(pid))
}

// SetGoProc says how to read the goroutine labels of Go program pid.
func (t *Tracer) SetGoProc(pid uint32, p support.GoProc) error {
	return t.objs.GoProcs.Put(pid, p)
}

// DeleteGoProc forgets a Go program; a missing one is not an error.
func (t *Tracer) DeleteGoProc(pid uint32) error {
	return ignoreMissing(t.objs.GoProcs.Delete(pid))
}

// DeleteAPMProc forgets a process's APM agent; a missing one is not an
// error.
func (t *Tracer) DeleteAPMProc(pid uint32) error {
	return ignoreMissing(t.objs.APMProcs.Delete(pid))
}

// DeleteKnownFile forgets a file key; a missing one is not an error.
func (t *Tracer) DeleteKnownFile(k support.FileKey) error {
	return ignoreMissing(t.objs.KnownFiles.Delete(k))
}

// SetPidMapping writes one prefix of a process's mapping.
func (t *Tracer) SetPidMapping(k support.PidMappingKey, v support.PidMapping) error {
	return t.objs.PidMappings.Put(k, v)
}

// DeletePidMapping removes one prefix; a missing one is not an error.
func (t *Tracer) DeletePidMapping(k support.PidMappingKey) error {
	return ignoreMissing(t.objs.PidMappings.Delete(k))
}

func ignoreMissing(err error) error {
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	}
	return err
}

// PidMappingPIDs counts the mapping trie's entries per pid, by walking the
// trie: for tests and debugging, not the sampling path.
func (t *Tracer) PidMappingPIDs() (map[uint32]int, error) {
	counts := map[uint32]int{}
	var k support.PidMappingKey
	var v support.PidMapping
	it := t.objs.PidMappings.Iterate()
	for it.Next(&k, &v) {
		counts[k.PID]++
	}
	return counts, it.Err()
}
