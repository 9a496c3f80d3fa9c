// status.cc: human-readable rendering of errors.
#include "common/status.h"

namespace memforensics {

std::string Error::describe() const {
  if (offset < 0) return message;
  return message + " (at byte offset " + std::to_string(offset) + ")";
}

}  // namespace memforensics
