package libpf

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"io"
	"os"
)

// FileID identifies an executable file independently of where it is
// installed: 16 bytes, rendered as 32 lowercase hex digits.
type FileID [16]byte

// fileIDChunk is how much of the head and of the tail of a file the id covers.
const fileIDChunk = 4096

// FileIDFromExecutable computes the reference profiler's file id:
// SHA-256(first 4 KiB ‖ last 4 KiB ‖ big-endian uint64 length), truncated to
// 16 bytes. Files shorter than 8 KiB hash some bytes twice, as the reference
// does.
func FileIDFromExecutable(r io.ReadSeeker) (FileID, error) {
	h := sha256.New()
	if _, err := r.Seek(0, io.SeekStart); err != nil {
		return FileID{}, fmt.Errorf("seeking to file start: %w", err)
	}
	if _, err := io.Copy(h, io.LimitReader(r, fileIDChunk)); err != nil {
		return FileID{}, fmt.Errorf("hashing file head: %w", err)
	}
	size, err := r.Seek(0, io.SeekEnd)
	if err != nil {
		return FileID{}, fmt.Errorf("seeking to file end: %w", err)
	}
	if _, err := r.Seek(-min(size, fileIDChunk), io.SeekEnd); err != nil {
		return FileID{}, fmt.Errorf("seeking to file tail: %w", err)
	}
	if _, err := io.Copy(h, r); err != nil {
		return FileID{}, fmt.Errorf("hashing file tail: %w", err)
	}
	var length [8]byte
	binary.BigEndian.PutUint64(length[:], uint64(size))
	h.Write(length[:])
	var id FileID
	copy(id[:], h.Sum(nil))
	return id, nil
}

// FileIDFromKernelBuildID is the file id of the kernel image or of a module:
// FNV-128a over the hex form of its GNU build id.
func FileIDFromKernelBuildID(buildIDHex string) FileID {
	h := fnv.New128a()
	h.Write([]byte(buildIDHex))
	var id FileID
	copy(id[:], h.Sum(nil))
	return id
}

// String returns the id as 32 lowercase hex digits (the OTLP htlhash form).
func (id FileID) String() string { return hex.EncodeToString(id[:]) }

// IsZero reports whether the id is unset.
func (id FileID) IsZero() bool { return id == FileID{} }

// Low64 is the 64-bit truncation BPF maps key files by.
func (id FileID) Low64() uint64 { return binary.BigEndian.Uint64(id[8:]) }

// FileIDFromPath is FileIDFromExecutable of the file at path.
func FileIDFromPath(path string) (FileID, error) {
	f, err := os.Open(path)
	if err != nil {
		return FileID{}, err
	}
	defer f.Close()
	return FileIDFromExecutable(f)
}
