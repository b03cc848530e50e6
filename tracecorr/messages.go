package tracecorr

import (
	"encoding/binary"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// Message types and minor versions of the spec's socket messages. Every
// message starts with the type and the minor version, two uint16 in the
// host's byte order.
const (
	correlationType   = 1
	correlationMinor  = 1
	registrationType  = 2
	registrationMinor = 1
)

// correlationSize is the size of a correlation message: the header, trace
// id, transaction id, stack-trace id and count.
const correlationSize = 4 + 16 + 8 + 16 + 2

// maxMessageCount is the largest count one correlation message carries;
// larger counts are split over several messages.
const maxMessageCount = 1<<16 - 1

// registrationMessage is the message that tells an agent a profiler runs
// on its host: how long after a sample its correlation message may arrive,
// and the host.id the profiler reports.
func registrationMessage(samplesDelayMs uint32, hostID string) []byte {
	b := make([]byte, 0, 12+len(hostID))
	b = binary.NativeEndian.AppendUint16(b, registrationType)
	b = binary.NativeEndian.AppendUint16(b, registrationMinor)
	b = binary.NativeEndian.AppendUint32(b, samplesDelayMs)
	b = binary.NativeEndian.AppendUint32(b, uint32(len(hostID)))
	return append(b, hostID...)
}

// correlationMessage says that count samples of stack ran in the given
// trace and transaction since the last report.
func correlationMessage(k corrKey, count uint16) []byte {
	b := make([]byte, 0, correlationSize)
	b = binary.NativeEndian.AppendUint16(b, correlationType)
	b = binary.NativeEndian.AppendUint16(b, correlationMinor)
	b = append(b, k.traceID[:]...)
	b = append(b, k.transactionID[:]...)
	stack := k.stack.Bytes()
	b = append(b, stack[:]...)
	return binary.NativeEndian.AppendUint16(b, count)
}

// corrKey is what a correlation message counts samples of.
type corrKey struct {
	traceID       [16]byte
	transactionID [8]byte
	stack         libpf.TraceHash
}
