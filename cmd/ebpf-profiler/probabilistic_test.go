package main

import (
	"context"
	"slices"
	"testing"
	"time"
)

// switchAt is a switch of sampling and the draw that decided it (0 is the
// start-up decision).
type switchAt struct {
	draw int
	on   bool
}

// TestProbabilisticDecisions drives the decisions with a fake clock (a tick
// channel) and a fake random source, and checks which draws switched
// sampling, and to what.
func TestProbabilisticDecisions(t *testing.T) {
	tests := []struct {
		name      string
		threshold uint
		// draws are the random numbers, the start-up decision's first.
		draws        []uint
		wantSwitches []switchAt
		wantOn       bool
	}{
		{name: "threshold 50", threshold: 50,
			draws:        []uint{10, 60, 49, 50, 99, 0, 0},
			wantSwitches: []switchAt{{1, false}, {2, true}, {3, false}, {5, true}},
			wantOn:       true},
		{name: "threshold 1 samples only on 0", threshold: 1,
			draws:        []uint{1, 0, 99},
			wantSwitches: []switchAt{{0, false}, {1, true}, {2, false}},
			wantOn:       false},
		{name: "threshold 99 stops only on 99", threshold: 99,
			draws:        []uint{98, 99, 98, 0},
			wantSwitches: []switchAt{{1, false}, {2, true}},
			wantOn:       true},
		{name: "no change, no switch", threshold: 30,
			draws:  []uint{29, 0, 15, 29},
			wantOn: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			drawn := 0
			s := &switchRecorder{drawn: &drawn}
			p := newProbabilistic(tt.threshold, time.Minute, s)
			p.draw = func() uint {
				drawn++
				return tt.draws[drawn-1]
			}
			p.decide()
			ticks := make(chan time.Time, len(tt.draws))
			for range len(tt.draws) - 1 {
				ticks <- time.Time{}
			}
			close(ticks)
			p.run(context.Background(), ticks)
			if drawn != len(tt.draws) {
				t.Errorf("%d draws for %d ticks and the start", drawn, len(tt.draws)-1)
			}
			if !slices.Equal(s.switches, tt.wantSwitches) {
				t.Errorf("switches %v, want %v", s.switches, tt.wantSwitches)
			}
			if p.on.Load() != tt.wantOn {
				t.Errorf("sampling on = %v, want %v", p.on.Load(), tt.wantOn)
			}
		})
	}
}

// switchRecorder records each switch with the number of the draw that
// made it.
type switchRecorder struct {
	drawn    *int
	switches []switchAt
}

func (s *switchRecorder) SetSampling(on bool) error {
	s.switches = append(s.switches, switchAt{*s.drawn - 1, on})
	return nil
}

func TestProbabilisticStopsWithContext(t *testing.T) {
	p := newProbabilistic(50, time.Minute, &switchRecorder{drawn: new(int)})
	p.draw = func() uint { t.Error("drew after the context ended"); return 0 }
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p.run(ctx, make(chan time.Time))
}

// TestProbabilisticDrawRange checks the real random source stays in
// [0, 100) and reaches both ends, so threshold t samples t% of intervals.
func TestProbabilisticDrawRange(t *testing.T) {
	p := newProbabilistic(50, time.Minute, &switchRecorder{drawn: new(int)})
	var seen [100]bool
	for range 100000 {
		n := p.draw()
		if n >= 100 {
			t.Fatalf("drew %d", n)
		}
		seen[n] = true
	}
	if i := slices.Index(seen[:], false); i >= 0 {
		t.Errorf("never drew %d in 100,000 draws", i)
	}
}
