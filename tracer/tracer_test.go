package tracer

import "testing"

func TestProcessedInsns(t *testing.T) {
	tests := []struct {
		log  string
		want uint32
		ok   bool
	}{
		// 5.10's statistics line.
		{"processed 31 insns (limit 1000000) max_states_per_insn 0 total_states 2 peak_states 2 mark_read 1\n", 31, true},
		// A longer log whose statistics follow the instructions.
		{"func#0 @0\n0: R1=ctx(id=0,off=0,imm=0)\nverification time 1234 usec\nstack depth 88\n" +
			"processed 245321 insns (limit 1000000) max_states_per_insn 4 total_states 9000\n", 245321, true},
		{"", 0, false},
		// Only a whole line counts.
		{"0: (b7) r0 = 0 ; processed 12 insns\n", 0, false},
		{"processed 99999999999 insns\n", 0, false},
	}
	for _, tt := range tests {
		got, ok := processedInsns(tt.log)
		if got != tt.want || ok != tt.ok {
			t.Errorf("processedInsns(%q) = %d, %v; want %d, %v", tt.log, got, ok, tt.want, tt.ok)
		}
	}
}
