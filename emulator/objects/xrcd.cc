#include "emulator/objects/xrcd.h"

#include <cerrno>

namespace rdmaemu::objects {

Result<std::shared_ptr<const XrcDomain>> XrcdTable::Open(std::optional<FileKey> file, bool create,
                                                        bool exclusive) {
  std::lock_guard lock(mu_);
  // Domains whose last holder has gone leave their file free again.
  std::erase_if(by_file_, [](const auto& entry) { return entry.second.expired(); });
  if (file) {
    if (auto it = by_file_.find(*file); it != by_file_.end()) {
      if (exclusive) {
        return InvalidArgument("O_EXCL: the file already names an XRC domain of this device");
      }
      return it->second.lock();
    }
    if (!create) {
      // The kernel's errno here (ib_uverbs_open_xrcd): "try again with O_CREAT".
      return Status::Error(EAGAIN, "the file names no XRC domain of this device yet and O_CREAT "
                                   "is not set in oflags");
    }
  }
  auto domain = std::make_shared<XrcDomain>();
  domain->number = next_++;
  if (file) by_file_[*file] = domain;
  return std::shared_ptr<const XrcDomain>(std::move(domain));
}

}  // namespace rdmaemu::objects
