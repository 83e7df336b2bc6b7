package guard

import (
	"fmt"
	"strings"
)

// CanonicalResource is the one form of a paid resource's URL that the
// duplicate_payment rule compares: the scheme in lower case, the host as
// HostOfURL canonicalises it (user information and port dropped), the path
// with dot segments removed ("/" when empty), and the query; the fragment is
// dropped. In path and query, percent-encoded unreserved characters are
// decoded, other escapes are written in upper case, and bytes that must be
// escaped are, so "/%7Ea" and "/~a", "/ü" and "/%C3%BC" are one resource.
// A backslash in the path reads as a slash, as a browser reads it. With
// allowUser false (a caller's question), a URL with user information is
// refused, since it disguises the host.
func CanonicalResource(raw string, allowUser bool) (string, error) {
	raw = strings.TrimSpace(raw)
	host, hadUser, err := hostOfURL(raw)
	if err != nil {
		return "", err
	}
	if hadUser && !allowUser {
		return "", fmt.Errorf("URL %q carries user information, which disguises the host; give the URL without it", clip(raw))
	}
	return resourceFrom(raw, host)
}

// resourceFrom is CanonicalResource for a trimmed raw URL whose canonical
// host is already known (hostOfURL read it).
func resourceFrom(raw, host string) (string, error) {
	var err error
	i := strings.Index(raw, "://")
	scheme := strings.ToLower(raw[:i])
	rest := raw[i+3:]
	end := strings.IndexAny(rest, "/?#\\")
	if end < 0 {
		end = len(rest)
	}
	rest = rest[end:]
	if f := strings.IndexByte(rest, '#'); f >= 0 {
		rest = rest[:f]
	}
	path, query, _ := strings.Cut(rest, "?")
	path = strings.ReplaceAll(path, "\\", "/")
	if path, err = normalizeEscapes(path); err != nil {
		return "", fmt.Errorf("URL %q: the path %w", clip(raw), err)
	}
	if query, err = normalizeEscapes(query); err != nil {
		return "", fmt.Errorf("URL %q: the query %w", clip(raw), err)
	}
	path = removeDotSegments(path)
	if path == "" {
		path = "/"
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	var b strings.Builder
	b.Grow(len(scheme) + 3 + len(host) + len(path) + 1 + len(query))
	b.WriteString(scheme)
	b.WriteString("://")
	b.WriteString(host)
	b.WriteString(path)
	if query != "" {
		b.WriteByte('?')
		b.WriteString(query)
	}
	return b.String(), nil
}

func isUnreserved(c byte) bool {
	return isAlpha(c) || isDigit(c) || c == '-' || c == '.' || c == '_' || c == '~'
}

// keptAsIs are the reserved characters (RFC 3986 gen-delims and
// sub-delims) a URL may carry unescaped in a path or query.
func keptAsIs(c byte) bool { return strings.IndexByte(":/?#[]@!$&'()*+,;=", c) >= 0 }

func unhex(c byte) (byte, bool) {
	switch {
	case isDigit(c):
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// normalizeEscapes writes s with one percent-encoding (RFC 3986 §6.2.2).
func normalizeEscapes(s string) (string, error) {
	// Most paths and queries need nothing changed: given back as they are,
	// without a copy.
	plain := true
	for i := 0; i < len(s) && plain; i++ {
		plain = s[i] != '%' && (isUnreserved(s[i]) || keptAsIs(s[i]))
	}
	if plain {
		return s, nil
	}
	return normalizeEscapesAll(s)
}

// normalizeEscapesAll is normalizeEscapes byte by byte.
func normalizeEscapesAll(s string) (string, error) {
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '%':
			if i+2 >= len(s) {
				return "", fmt.Errorf("has a %% that does not start an escape")
			}
			hi, ok1 := unhex(s[i+1])
			lo, ok2 := unhex(s[i+2])
			if !ok1 || !ok2 {
				return "", fmt.Errorf("has a %% that does not start an escape")
			}
			v := hi<<4 | lo
			if isUnreserved(v) {
				b.WriteByte(v)
			} else {
				b.WriteByte('%')
				b.WriteByte(hexDigits[v>>4])
				b.WriteByte(hexDigits[v&15])
			}
			i += 2
		case isUnreserved(c) || keptAsIs(c):
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
		}
	}
	return b.String(), nil
}

// removeDotSegments is RFC 3986 §5.2.4 for an absolute path.
func removeDotSegments(in string) string {
	// An absolute path with no segment that starts with a dot has no dot
	// segment: it is its own result.
	if strings.HasPrefix(in, "/") && !strings.Contains(in, "/.") {
		return in
	}
	return removeDotSegmentsAll(in)
}

// removeDotSegmentsAll is removeDotSegments segment by segment.
func removeDotSegmentsAll(in string) string {
	var out []string
	segs := strings.Split(in, "/")
	if len(segs) > 0 && segs[0] == "" {
		segs = segs[1:]
	}
	for i, seg := range segs {
		last := i == len(segs)-1
		switch seg {
		case ".":
			if last {
				out = append(out, "")
			}
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			if last {
				out = append(out, "")
			}
		default:
			out = append(out, seg)
		}
	}
	if len(out) == 0 {
		if in == "" {
			return ""
		}
		return "/"
	}
	return "/" + strings.Join(out, "/")
}
