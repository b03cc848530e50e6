package applog

import (
	"reflect"
	"testing"
)

func TestParse(t *testing.T) {
	out := "loaded 100\n" +
		"idle 7 100 200\n" +
		"published 150\n" +
		"tx 7 101112131415161718191a1b1c1d1e1f a0a1a2a3a4a5a6a7 5051525354555657 200 600\n" +
		"msg 650 0200010001000000\n"
	l, err := Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	want := &Log{
		Loaded: 100, Published: 150,
		Idles: []Window{{7, 100, 200}},
		Txs: []Tx{{
			Window:        Window{7, 200, 600},
			TraceID:       [16]byte{0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f},
			TransactionID: [8]byte{0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7},
			SpanID:        [8]byte{0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56, 0x57},
		}},
		Msgs: []Message{{650, []byte{2, 0, 1, 0, 1, 0, 0, 0}}},
	}
	if !reflect.DeepEqual(l, want) {
		t.Errorf("Parse:\n got %+v\nwant %+v", l, want)
	}

	for _, bad := range []string{
		"loaded x\n",
		"tx 7 1011 a0a1a2a3a4a5a6a7 5051525354555657 200 600\n", // short trace id
		"msg 1 zz\n",
		"hello\n",
	} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) succeeded", bad)
		}
	}
}

func TestInside(t *testing.T) {
	w := Window{TID: 7, Start: 100, End: 200}
	for _, c := range []struct {
		tid       int
		at, slack uint64
		want      bool
	}{
		{7, 150, 10, true},
		{8, 150, 10, false},
		{7, 105, 10, false},
		{7, 195, 10, false},
		{7, 101, 0, true},
		{7, 100, 0, false},
	} {
		if got := w.Inside(c.tid, c.at, c.slack); got != c.want {
			t.Errorf("Inside(%d, %d, %d) = %v", c.tid, c.at, c.slack, got)
		}
	}
}
