package lite

import "unicode/utf8"

// ToValidUTF8 returns s with each run of bytes that are not valid UTF-8
// replaced by one U+FFFD, as strings.ToValidUTF8(s, "\uFFFD") does; s
// itself when it is valid. (The library call links strings.Builder's
// growth and the unicode package's Builder paths; this is a loop.)
func ToValidUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	b := make([]byte, 0, len(s)+2*utf8.UTFMax)
	inRun := false
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			b = append(b, c)
			i, inRun = i+1, false
			continue
		}
		if _, w := utf8.DecodeRuneInString(s[i:]); w > 1 {
			b = append(b, s[i:i+w]...)
			i, inRun = i+w, false
			continue
		}
		if !inRun {
			b = append(b, "\uFFFD"...)
		}
		i, inRun = i+1, true
	}
	return string(b)
}
