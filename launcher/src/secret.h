// The secret that authenticates a job's store clients.
//
// Single-node jobs get a fresh random secret. The agents of a multi-node job
// must share one: --rdzv-secret-file FILE, else $NEURON_RDZV_SECRET, else
// ~/.config/torchneuron/rdzv-secret, created (mode 0600) by the first agent
// that finds it missing; a shared home directory gives it to every node.
#pragma once

#include <string>

namespace neuron::launcher {

// Throws InvalidUsage naming the file (or $NEURON_RDZV_SECRET) when it
// cannot be read or is empty, when it can be read by other users, or when
// the secret is too short or blank (auth::CheckSecret).
std::string LoadOrCreateRdzvSecret(const std::string& secret_file);

}  // namespace neuron::launcher
