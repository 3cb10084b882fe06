// Termination signals for long-running processes (router, workers, `tandem up`). Handlers, not
// sigwait: libraries start threads before main (OpenBLAS) that do not block signals, and a signal
// delivered to such a thread would otherwise take its default action and kill the process
// mid-drain.
//
// InstallTerminationHandlers() at the start of main; WaitForTerminationSignal() blocks until the
// first SIGTERM or SIGINT and returns it. A second one ends the process at once (exit 128 +
// signal): a second Ctrl-C skips the drain.
#pragma once

namespace tandem {

void InstallTerminationHandlers();
int WaitForTerminationSignal();
// Non-blocking: whether a termination signal has arrived.
bool TerminationRequested();

}  // namespace tandem
