package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
)

// A problem is one broken link or a missing table of contents, named by
// file and line.
type problem struct {
	File string
	Line int
	What string
}

func (p problem) String() string { return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.What) }

// page is one Markdown file as the checks see it: its lines outside fenced
// code blocks (inline code removed), and its headings.
type page struct {
	path     string
	lines    []textLine
	headings []heading
}

type textLine struct {
	n    int
	text string
}

type heading struct {
	line  int
	level int
	slug  string
}

var (
	linkRE    = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	headingRE = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	codeRE    = regexp.MustCompile("`+[^`]*`+")
	inlineRE  = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	tocRE     = regexp.MustCompile(`^\s*[-*] \[[^\]]*\]\(#([^)]+)\)`)
)

// readPage reads a Markdown file. Fenced code blocks are skipped; inline
// code is kept for headings (GitHub makes anchors of its text) and removed
// from the text searched for links.
func readPage(path string) (*page, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p := &page{path: path}
	seen := map[string]int{}
	fence := ""
	for i, l := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimLeft(l, " ")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		if m := headingRE.FindStringSubmatch(l); m != nil {
			s := slug(m[2])
			if k := seen[s]; k > 0 {
				seen[s] = k + 1
				s = fmt.Sprintf("%s-%d", s, k)
			} else {
				seen[s] = 1
			}
			p.headings = append(p.headings, heading{line: i + 1, level: len(m[1]), slug: s})
		}
		p.lines = append(p.lines, textLine{n: i + 1, text: codeRE.ReplaceAllString(l, "")})
	}
	return p, nil
}

// slug is the anchor GitHub gives a heading: the text as rendered (link
// targets and formatting dropped), lower case, punctuation removed, spaces
// turned into hyphens.
func slug(text string) string {
	text = inlineRE.ReplaceAllString(text, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func (p *page) anchors() map[string]bool {
	out := make(map[string]bool, len(p.headings))
	for _, h := range p.headings {
		out[h.slug] = true
	}
	return out
}

// checkLinks checks every relative link of each file: the file or
// directory it names exists and, with a #fragment, the Markdown file it
// names has that heading. Links to other schemes (https:, mailto:) are not
// followed. It returns the problems found and how many links it checked.
func checkLinks(files []string) ([]problem, int, error) {
	pages := map[string]*page{}
	load := func(path string) (*page, error) {
		if p, ok := pages[path]; ok {
			return p, nil
		}
		p, err := readPage(path)
		if err != nil {
			return nil, err
		}
		pages[path] = p
		return p, nil
	}
	var problems []problem
	checked := 0
	for _, f := range files {
		p, err := load(f)
		if err != nil {
			return nil, 0, err
		}
		for _, l := range p.lines {
			for _, m := range linkRE.FindAllStringSubmatch(l.text, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				bad := func(format string, args ...any) {
					problems = append(problems, problem{File: f, Line: l.n, What: fmt.Sprintf("link %s: ", target) + fmt.Sprintf(format, args...)})
				}
				path, frag, _ := strings.Cut(target, "#")
				dest := f
				if path != "" {
					dest = filepath.Join(filepath.Dir(f), filepath.FromSlash(path))
					if _, err := os.Stat(dest); err != nil {
						bad("%s does not exist", dest)
						continue
					}
				}
				if frag == "" {
					continue
				}
				if !strings.HasSuffix(dest, ".md") {
					bad("an anchor into %s, which is not a Markdown page", dest)
					continue
				}
				tp, err := load(dest)
				if err != nil {
					bad("%v", err)
					continue
				}
				if !tp.anchors()[frag] {
					bad("%s has no heading with anchor #%s", dest, frag)
				}
			}
		}
	}
	return problems, checked, nil
}

// checkContents checks that a page opens with a table of contents: before
// its first section heading (##), a list of links to the page's own
// anchors that names every section heading.
func checkContents(path string) ([]problem, error) {
	p, err := readPage(path)
	if err != nil {
		return nil, err
	}
	first := 0
	for _, h := range p.headings {
		if h.level == 2 {
			first = h.line
			break
		}
	}
	if first == 0 {
		return []problem{{File: path, Line: 1, What: "no section headings (##), so nothing for a table of contents to list"}}, nil
	}
	listed := map[string]bool{}
	for _, l := range p.lines {
		if l.n >= first {
			break
		}
		// The link text may hold inline code, which readPage removed.
		if m := tocRE.FindStringSubmatch(l.text); m != nil {
			listed[m[1]] = true
		}
	}
	if len(listed) == 0 {
		return []problem{{File: path, Line: 1, What: "no table of contents (a list of #anchor links) before the first section"}}, nil
	}
	var problems []problem
	for _, h := range p.headings {
		if h.level == 2 && !listed[h.slug] {
			problems = append(problems, problem{File: path, Line: h.line, What: fmt.Sprintf("section #%s is not in the table of contents", h.slug)})
		}
	}
	return problems, nil
}
