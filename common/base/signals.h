// Termination signals for long-running processes (router, workers, `tandem up`): a thread of its
// own waits for them (sigwait), and every thread started after InstallTerminationHandlers() blocks
// them, so none is taken by a thread asleep elsewhere. Handlers too: libraries start threads before
// main (OpenBLAS) that do not block signals, and a signal delivered to such a thread would
// otherwise take its default action and kill the process mid-drain. Child processes
// (subprocess.h) start with no signal blocked.
//
// InstallTerminationHandlers() at the start of main, before the process starts threads of its
// own; WaitForTerminationSignal() blocks until the first SIGTERM or SIGINT and returns it. A second
// one ends the process at once (exit 128 + signal): a second Ctrl-C skips the drain.
#pragma once

namespace tandem {

void InstallTerminationHandlers();
int WaitForTerminationSignal();
// Non-blocking: whether a termination signal has arrived.
bool TerminationRequested();

}  // namespace tandem
