package poll

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// fakeT records Until's failure instead of failing the test.
type fakeT struct{ msg string }

func (*fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
}

func TestUntilReturnsOnceNil(t *testing.T) {
	n := 0
	var ft fakeT
	Until(&ft, 10*time.Second, "third call", func() error {
		if n++; n < 3 {
			return fmt.Errorf("call %d", n)
		}
		return nil
	})
	if ft.msg != "" || n != 3 {
		t.Fatalf("Until failed (%q) or called fn %d times, want 3", ft.msg, n)
	}
}

func TestUntilReportsLastError(t *testing.T) {
	n := 0
	var ft fakeT
	Until(&ft, 200*time.Millisecond, "never", func() error { n++; return fmt.Errorf("call %d", n) })
	want := fmt.Sprintf("never: not within 200ms: call %d", n)
	if n < 2 || ft.msg != want {
		t.Fatalf("after %d calls: message %q, want %q", n, ft.msg, want)
	}
}

func TestWaitWrapsLastErrorAndStopsWithContext(t *testing.T) {
	sentinel := errors.New("sentinel")
	if err := Wait(context.Background(), time.Millisecond, 20*time.Millisecond, func() error { return sentinel }); !errors.Is(err, sentinel) {
		t.Fatalf("Wait = %v, want it to wrap the last error", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := Wait(ctx, time.Millisecond, time.Hour, func() error {
		if calls++; calls == 3 {
			cancel()
		}
		return sentinel
	})
	if !errors.Is(err, context.Canceled) || !errors.Is(err, sentinel) || !strings.Contains(err.Error(), "sentinel") {
		t.Fatalf("Wait after cancel = %v, want context.Canceled and the last error", err)
	}
	if err := Wait(context.Background(), time.Hour, time.Hour, Cond(func() bool { return true })); err != nil {
		t.Fatalf("Wait on a true condition = %v", err)
	}
}
