#include "issue_context.h"

namespace neuron::collectives::detail {

namespace {
thread_local IssueContext* current = nullptr;
}  // namespace

ScopedIssue::ScopedIssue(IssueContext* context) : previous_(current) { current = context; }

ScopedIssue::~ScopedIssue() { current = previous_; }

IssueContext* ScopedIssue::Current(const runtime::SimClock* clock) {
  return current != nullptr && current->clock == clock ? current : nullptr;
}

}  // namespace neuron::collectives::detail
