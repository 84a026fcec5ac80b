package spawner

import "time"

// SetStoppedRecheckForTest makes stopped slots look at their Secret every d, and returns
// a func that puts it back. Call it before the spawner starts.
func SetStoppedRecheckForTest(d time.Duration) (restore func()) {
	old := stoppedRecheck
	stoppedRecheck = d
	return func() { stoppedRecheck = old }
}
