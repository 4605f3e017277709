// neuronrun zygote [--preload MODULES] -- COMMAND [ARGS...]: one zygote
// (zygote.h) for every neuronrun job COMMAND starts, as ssh-agent is for
// its command. The zygote imports MODULES once and listens on a socket in
// a private directory; COMMAND runs with NEURON_ZYGOTE set to it, and each
// job run with --preload (NEURON_PRELOAD) that it serves forks its Python
// ranks from there instead of starting a zygote of its own. When COMMAND
// exits, the zygote goes and the exit status is COMMAND's.
#pragma once

namespace neuron::launcher {

// argv: what follows "zygote". 2 for bad usage; else COMMAND's status (128
// + signal when a signal ended it), or 127 when it cannot be run.
int ZygoteMain(int argc, char** argv);

}  // namespace neuron::launcher
