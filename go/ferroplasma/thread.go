package ferroplasma

import "runtime"

// The C library keeps the last error message per OS thread.
func runtimeLockOSThread()   { runtime.LockOSThread() }
func runtimeUnlockOSThread() { runtime.UnlockOSThread() }
