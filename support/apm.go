package support

// APMProc mirrors struct apm_proc: where a process's APM agent keeps each
// thread's correlation record.
type APMProc struct {
	TLSOffset int64
}

// apmContext mirrors struct apm_context, which DecodeEvent copies into
// libpf.APMContext.
type apmContext struct {
	TraceID       [16]byte
	SpanID        [8]byte
	TransactionID [8]byte
}
