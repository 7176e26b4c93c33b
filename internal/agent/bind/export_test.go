package bind

import "net/netip"

// Hook points a test may stop the process at (see testHook).
const (
	HookBeforeRecord = hookBeforeRecord
	HookRecorded     = hookRecorded
	HookBound        = hookBound
	HookUnbound      = hookUnbound
	HookRecordRename = hookRecordRename
)

// SetTestHook installs f as the package's test hook (nil removes it).
func SetTestHook(f func(point string, ip netip.Addr)) { testHook = f }

// SetDropMark makes the Binder add addresses as a kernel without IFA_PROTO
// keeps them: without the attribute.
func SetDropMark(on bool) { testDropMark = on }
