package repocheck

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"unicode"
)

var (
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*$`)
)

// TestDocLinksResolve fails for a relative link in the README or docs/
// whose file is missing, or whose #anchor names no heading there.
func TestDocLinksResolve(t *testing.T) {
	_, here, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(here), "..", "..")
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("no docs/*.md")
	}
	for _, doc := range append(docs, filepath.Join(root, "README.md")) {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, doc)
		for _, m := range mdLink.FindAllStringSubmatch(string(text), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := doc
			if file != "" {
				path = filepath.Join(filepath.Dir(doc), file)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s: link %s: %v", rel, target, err)
					continue
				}
			}
			if anchor != "" && !hasAnchor(t, path, anchor) {
				t.Errorf("%s: link %s: no heading makes the anchor #%s", rel, target, anchor)
			}
		}
	}
}

// hasAnchor says whether a Markdown file has a heading whose GitHub anchor
// is anchor.
func hasAnchor(t *testing.T, path, anchor string) bool {
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mdHeading.FindAllStringSubmatch(string(text), -1) {
		if slug(m[1]) == anchor {
			return true
		}
	}
	return false
}

// slug is GitHub's anchor of a heading: lower case, spaces to hyphens,
// other punctuation dropped.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
