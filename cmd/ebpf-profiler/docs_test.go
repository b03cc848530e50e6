package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestFlagsDocumented fails for a flag that docs/flags.md does not name,
// or names without the daemon having it.
func TestFlagsDocumented(t *testing.T) {
	var help bytes.Buffer
	if _, err := parseFlags([]string{"-h"}, nil, &help); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z0-9-]+)`).FindAllStringSubmatch(help.String(), -1) {
		flags[m[1]] = true
	}
	if len(flags) < 10 {
		t.Fatalf("only %d flags in the help output:\n%s", len(flags), help.String())
	}
	doc, err := os.ReadFile("../../docs/flags.md")
	if err != nil {
		t.Fatal(err)
	}
	for name := range flags {
		if !strings.Contains(string(doc), "`-"+name+"`") {
			t.Errorf("flag -%s is not in docs/flags.md", name)
		}
	}
	// A table row's first cell names a flag.
	for _, m := range regexp.MustCompile("(?m)^\\| `-([a-z0-9-]+)`").FindAllStringSubmatch(string(doc), -1) {
		if !flags[m[1]] {
			t.Errorf("docs/flags.md documents -%s, which the daemon does not have", m[1])
		}
	}
}
