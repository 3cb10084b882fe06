// Whole-buffer I/O on a connected socket: loops over partial sends and receives and EINTR, and a
// send never raises SIGPIPE. Each returns false on failure with errno set, 0 when a receive met the
// end of the stream (the peer closed the connection); a socket timeout shows as EAGAIN or
// EWOULDBLOCK.
#pragma once

#include <cstddef>

namespace tandem {

bool SendAll(int fd, const void* data, size_t n);
bool RecvAll(int fd, void* data, size_t n);

}  // namespace tandem
