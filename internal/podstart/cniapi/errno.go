package cniapi

import "syscall"

// errNotExist is the dial error of a socket path that does not exist.
var errNotExist error = syscall.ENOENT
