// null_stream.h: an ostream that discards what is written, for fuzz targets that render output
// (the renderers still walk every value).
#pragma once

#include <ostream>
#include <streambuf>

namespace memforensics::fuzz {

class NullBuf : public std::streambuf {
 protected:
  int overflow(int c) override { return traits_type::not_eof(c); }
  std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
};

}  // namespace memforensics::fuzz
