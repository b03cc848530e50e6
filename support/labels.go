package support

// GoProc mirrors struct go_proc: how BPF reaches the labels of the
// goroutine a thread of a Go program runs (package
// processmanager/golabels).
type GoProc struct {
	TLSOffset   int64
	GM          uint16
	MCurg       uint16
	GLabels     uint16
	GInRegister uint8
	LabelsMap   uint8
}

// label mirrors struct label, one sample label after a trace's frames.
type label struct {
	KeyLen   uint8
	ValueLen uint8
	Flags    uint8
	_        [5]uint8
	Key      [16]byte
	Value    [48]byte
}

// ThreadCtxProc mirrors struct thread_ctx_proc: where a process keeps its
// threads' OpenTelemetry thread context pointer, as tls_variable_address
// takes it.
type ThreadCtxProc struct {
	TLSIndex  uint64
	TLSOffset uint64
	GOTPair   uint8
	_         [7]uint8
}

// ContextAttr is an attribute of a thread's OpenTelemetry context: its key
// an index into the process's key table.
type ContextAttr struct {
	Key   uint8
	Value string
}
