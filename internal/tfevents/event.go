package tfevents

import (
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of tensorflow/core/util/event.proto and
// tensorflow/core/framework/summary.proto that scalars need.
const (
	fieldEventWallTime    protowire.Number = 1 // double
	fieldEventStep        protowire.Number = 2 // int64
	fieldEventFileVersion protowire.Number = 3 // string (oneof what)
	fieldEventSummary     protowire.Number = 5 // Summary (oneof what)

	fieldSummaryValue protowire.Number = 1 // repeated Summary.Value

	fieldValueTag         protowire.Number = 1 // string
	fieldValueSimpleValue protowire.Number = 2 // float (oneof value)
)

// FileVersion is the first event of every file; TensorBoard checks it.
const FileVersion = "brain.Event:2"

// Scalar is one Summary.Value with a simple_value.
type Scalar struct {
	Tag   string
	Value float32
}

// Event is the part of tensorflow.Event this package writes and reads.
type Event struct {
	WallTime    float64 // seconds since the Unix epoch
	Step        int64
	FileVersion string
	Scalars     []Scalar
}

// marshal encodes e as a tensorflow.Event protobuf.
func (e Event) marshal() []byte {
	var b []byte
	b = protowire.AppendTag(b, fieldEventWallTime, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, math.Float64bits(e.WallTime))
	if e.Step != 0 {
		b = protowire.AppendTag(b, fieldEventStep, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(e.Step))
	}
	if e.FileVersion != "" {
		b = protowire.AppendTag(b, fieldEventFileVersion, protowire.BytesType)
		b = protowire.AppendString(b, e.FileVersion)
		return b
	}
	var summary []byte
	for _, s := range e.Scalars {
		var v []byte
		v = protowire.AppendTag(v, fieldValueTag, protowire.BytesType)
		v = protowire.AppendString(v, s.Tag)
		v = protowire.AppendTag(v, fieldValueSimpleValue, protowire.Fixed32Type)
		v = protowire.AppendFixed32(v, math.Float32bits(s.Value))
		summary = protowire.AppendTag(summary, fieldSummaryValue, protowire.BytesType)
		summary = protowire.AppendBytes(summary, v)
	}
	b = protowire.AppendTag(b, fieldEventSummary, protowire.BytesType)
	return protowire.AppendBytes(b, summary)
}

// UnmarshalEvent decodes the fields of a tensorflow.Event that Event holds
// and skips all others (graphs, histograms, images …).
func UnmarshalEvent(b []byte) (Event, error) {
	var e Event
	err := walkFields(b, func(num protowire.Number, typ protowire.Type, raw []byte) error {
		switch {
		case num == fieldEventWallTime && typ == protowire.Fixed64Type:
			v, _ := protowire.ConsumeFixed64(raw)
			e.WallTime = math.Float64frombits(v)
		case num == fieldEventStep && typ == protowire.VarintType:
			v, _ := protowire.ConsumeVarint(raw)
			e.Step = int64(v)
		case num == fieldEventFileVersion && typ == protowire.BytesType:
			v, _ := protowire.ConsumeBytes(raw)
			e.FileVersion = string(v)
		case num == fieldEventSummary && typ == protowire.BytesType:
			v, _ := protowire.ConsumeBytes(raw)
			scalars, err := unmarshalSummary(v)
			if err != nil {
				return fmt.Errorf("summary: %w", err)
			}
			e.Scalars = append(e.Scalars, scalars...)
		}
		return nil
	})
	if err != nil {
		return Event{}, fmt.Errorf("decode event: %w", err)
	}
	return e, nil
}

func unmarshalSummary(b []byte) ([]Scalar, error) {
	var out []Scalar
	err := walkFields(b, func(num protowire.Number, typ protowire.Type, raw []byte) error {
		if num != fieldSummaryValue || typ != protowire.BytesType {
			return nil
		}
		v, _ := protowire.ConsumeBytes(raw)
		var s Scalar
		var hasValue bool
		err := walkFields(v, func(num protowire.Number, typ protowire.Type, raw []byte) error {
			switch {
			case num == fieldValueTag && typ == protowire.BytesType:
				t, _ := protowire.ConsumeBytes(raw)
				s.Tag = string(t)
			case num == fieldValueSimpleValue && typ == protowire.Fixed32Type:
				f, _ := protowire.ConsumeFixed32(raw)
				s.Value, hasValue = math.Float32frombits(f), true
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("value: %w", err)
		}
		if hasValue {
			out = append(out, s)
		}
		return nil
	})
	return out, err
}

// walkFields calls fn for each field of the protobuf message b with the
// field's raw value bytes (everything after the tag).
func walkFields(b []byte, fn func(protowire.Number, protowire.Type, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("field tag: %w", protowire.ParseError(n))
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return fmt.Errorf("field %d: %w", num, protowire.ParseError(m))
		}
		if err := fn(num, typ, b[:m]); err != nil {
			return err
		}
		b = b[m:]
	}
	return nil
}
