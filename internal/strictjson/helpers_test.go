package strictjson

import (
	"bytes"
	"encoding/json"
	"reflect"
)

var typeOfOuter = reflect.TypeOf(outer{})

// repeated finds a name given twice in one object, by a plain token walk
// independent of Check's.
func repeated(data []byte) string {
	dec := json.NewDecoder(bytes.NewReader(data))
	var stack []map[string]bool
	var inObj []bool
	expectKey := false
	for {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{':
				stack = append(stack, map[string]bool{})
				inObj = append(inObj, true)
				expectKey = true
			case '[':
				stack = append(stack, nil)
				inObj = append(inObj, false)
				expectKey = false
			default:
				stack, inObj = stack[:len(stack)-1], inObj[:len(inObj)-1]
				expectKey = len(inObj) > 0 && inObj[len(inObj)-1]
			}
			continue
		}
		if expectKey {
			k := tok.(string)
			if stack[len(stack)-1][k] {
				return k
			}
			stack[len(stack)-1][k] = true
			expectKey = false
			continue
		}
		expectKey = len(inObj) > 0 && inObj[len(inObj)-1]
	}
}
