package server

// rawJSON is JSON text that is already encoded; it marshals as itself.
type rawJSON []byte

func (r rawJSON) MarshalJSON() ([]byte, error) { return r, nil }
