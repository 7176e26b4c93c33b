package scheduler

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

func TestParseCapacity(t *testing.T) {
	long := strings.Repeat("9", 100)
	tests := []struct {
		value   string
		limit   int
		want    int
		wantErr string // substring of the error; "" means valid
	}{
		{"0", 255, 0, ""},
		{"1", 255, 1, ""},
		{"5", 255, 5, ""},
		{"10", 255, 10, ""},
		{"255", 255, 255, ""},
		{"10", 10, 10, ""},
		{"0", 0, 0, ""},
		{"9223372036854775807", int(^uint(0) >> 1), int(^uint(0) >> 1), ""},

		{"", 255, 0, "empty"},
		{"abc", 255, 0, `byte 0 is 'a'`},
		{"-1", 255, 0, `byte 0 is '-'`},
		{"+5", 255, 0, `byte 0 is '+'`},
		{" 5", 255, 0, `byte 0 is ' '`},
		{"5 ", 255, 0, `byte 1 is ' '`},
		{"1.5", 255, 0, `byte 1 is '.'`},
		{"0x10", 255, 0, `byte 1 is 'x'`},
		{"1e2", 255, 0, `byte 1 is 'e'`},
		{"\uff15", 255, 0, "not a digit"}, // fullwidth five
		{"05", 255, 0, "leading zero"},
		{"00", 255, 0, "leading zero"},
		{"256", 255, 0, "above the limit"},
		{"300", 255, 0, "above the limit"},
		{"3", 2, 0, "above the limit"},
		{"1", 0, 0, "above the limit"},
		{"9223372036854775808", int(^uint(0) >> 1), 0, "above the limit"},
		{long, 255, 0, "above the limit"},
		{"5", -1, 0, "limit -1 is negative"},
	}
	for _, tt := range tests {
		got, err := ParseCapacity(tt.value, tt.limit)
		if tt.wantErr == "" {
			if err != nil || got != tt.want {
				t.Errorf("ParseCapacity(%q, %d) = %d, %v; want %d, nil", tt.value, tt.limit, got, err, tt.want)
			}
			continue
		}
		if err == nil {
			t.Errorf("ParseCapacity(%q, %d) = %d, nil; want an error containing %q", tt.value, tt.limit, got, tt.wantErr)
			continue
		}
		if got != 0 {
			t.Errorf("ParseCapacity(%q, %d) returned %d with its error; want 0", tt.value, tt.limit, got)
		}
		if !errors.Is(err, ErrInvalidCapacity) {
			t.Errorf("ParseCapacity(%q, %d) error %v does not wrap ErrInvalidCapacity", tt.value, tt.limit, err)
		}
		if !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("ParseCapacity(%q, %d) error %q does not contain %q", tt.value, tt.limit, err, tt.wantErr)
		}
	}
}

func TestParseCapacityErrorQuotesValueCut(t *testing.T) {
	_, err := ParseCapacity(strings.Repeat("x", 1000), 255)
	if err == nil {
		t.Fatal("no error for 1000 x's")
	}
	msg := err.Error()
	if !strings.Contains(msg, `"`+strings.Repeat("x", 64)+`"...`) || strings.Contains(msg, strings.Repeat("x", 65)) {
		t.Errorf("error should quote the first 64 bytes only: %s", msg)
	}
	if !strings.Contains(msg, CapacityAnnotation) || !strings.Contains(msg, "from 0 to 255") {
		t.Errorf("error should name the annotation and the valid range: %s", msg)
	}
}

func FuzzParseCapacity(f *testing.F) {
	for _, s := range []string{"0", "5", "255", "256", "05", "-1", "+5", " 5", "", "abc"} {
		f.Add(s, 255)
	}
	f.Fuzz(func(t *testing.T, s string, limit int) {
		got, err := ParseCapacity(s, limit)
		if err != nil {
			if got != 0 || !errors.Is(err, ErrInvalidCapacity) {
				t.Fatalf("ParseCapacity(%q, %d) = %d, %v", s, limit, got, err)
			}
			return
		}
		// A valid value is in range and is its own canonical spelling.
		if got < 0 || got > limit || strconv.Itoa(got) != s {
			t.Fatalf("ParseCapacity(%q, %d) = %d, which does not print back as %q", s, limit, got, s)
		}
	})
}
