package spawner

import "time"

// SetStoppedRecheckForTest makes stopped slots look at their Secret every d, and returns
// a func that puts it back. Call it before the spawner starts.
func SetStoppedRecheckForTest(d time.Duration) (restore func()) {
	old := stoppedRecheck
	stoppedRecheck = d
	return func() { stoppedRecheck = old }
}

// SetStreamRetryForTest makes the first window a failed streaming ping is opened again
// within d, and returns a func that puts it back. Call it before the spawner starts.
func SetStreamRetryForTest(d time.Duration) (restore func()) {
	old := streamRetry
	streamRetry = d
	return func() { streamRetry = old }
}
