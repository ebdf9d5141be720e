package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
)

// formFromJSON encodes a JSON body as application/x-www-form-urlencoded,
// the way Stripe's API reads forms: an object's fields by name, nested
// objects as name[field], arrays as name[0], name[1]; numbers as written,
// booleans as true and false, null as an empty value. Fields are sorted by
// name (url.Values.Encode), so the same body always encodes to the same
// bytes and a rerun matches the journal's fingerprint. A JSON string is
// taken as an already encoded form, checked and sent as is.
func formFromJSON(raw json.RawMessage) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("body: %w", err)
	}
	switch v := v.(type) {
	case string:
		if _, err := url.ParseQuery(v); err != nil {
			return nil, fmt.Errorf("body: not a form-encoded string: %w", err)
		}
		return []byte(v), nil
	case map[string]any:
		out := url.Values{}
		for k, fv := range v {
			if err := addForm(out, k, fv); err != nil {
				return nil, err
			}
		}
		return []byte(out.Encode()), nil
	}
	return nil, errors.New("body: with -body-format form, want a JSON object (fields) or a string (an encoded form)")
}

// addForm adds the value v under name, recursively.
func addForm(out url.Values, name string, v any) error {
	if name == "" {
		return errors.New("body: an empty field name")
	}
	switch v := v.(type) {
	case nil:
		out.Add(name, "")
	case string:
		out.Add(name, v)
	case json.Number:
		out.Add(name, v.String())
	case bool:
		out.Add(name, strconv.FormatBool(v))
	case map[string]any:
		for k, fv := range v {
			if err := addForm(out, name+"["+k+"]", fv); err != nil {
				return err
			}
		}
	case []any:
		for i, fv := range v {
			if err := addForm(out, name+"["+strconv.Itoa(i)+"]", fv); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("body: field %s: unsupported value", name)
	}
	return nil
}
