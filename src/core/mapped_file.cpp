#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace lily {

namespace {

const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

// Opens `path` for reading only if it is a regular file. O_NONBLOCK: opening a FIFO must not wait for
// a writer (it is refused right after); it has no effect on regular files.
struct RegularFile {
  int fd = -1;
  size_t size = 0;
  explicit RegularFile(const std::string& path) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      int e = errno;
      ::close(fd);
      fail("{}: cannot stat: {}", path, std::strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      fail("{}: is {}, not a regular file", path, file_kind(st.st_mode));
    }
    size = size_t(st.st_size);
  }
  ~RegularFile() { ::close(fd); }
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
};

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  RegularFile f(path);
  size_ = f.size;
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, f.fd, 0);
    if (p == MAP_FAILED) fail("{}: mmap failed: {}", path, std::strerror(errno));
    data_ = static_cast<const uint8_t*>(p);
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

std::string read_text_file(const std::string& path) {
  RegularFile f(path);
  std::string s(f.size, '\0');
  size_t got = 0;
  while (got < s.size()) {
    ssize_t n = ::read(f.fd, s.data() + got, s.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("{}: read failed: {}", path, std::strerror(errno));
    if (n == 0) break;  // the file shrank while being read
    got += size_t(n);
  }
  s.resize(got);
  return s;
}

}  // namespace lily
