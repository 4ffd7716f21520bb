#pragma once
#include <coio/core/result.hpp>
#include <coio/rdma/config.hpp>
#include <coio/rdma/detail/gid.hpp>
#include <coio/rdma/error.hpp>

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace coio::rdma {

/// Which device and port Device::open picks.
struct DeviceOptions {
  std::string name;       ///< empty: the first device with an ACTIVE port
  std::uint8_t port = 0;  ///< 0: the first ACTIVE port
};

/// An opened RDMA device: one port of it, the GID used on that port, and a
/// protection domain that memory regions and queue pairs are created in.
///
/// Guarantees: opening never crashes for lack of hardware: with no device
/// the result is RdmaErrc::noDevice, whose message names the alternatives.
/// The Device is immovable (QueuePairs and MemoryRegions refer to it) and
/// must outlive everything created from it. It does no I/O and resumes no
/// coroutine; any thread may use it, one at a time.
class Device {
 public:
  /// The names of the RDMA devices libibverbs lists (possibly none).
  static std::vector<std::string> list() {
    int count = 0;
    ibv_device** devices = ::ibv_get_device_list(&count);
    std::vector<std::string> names;
    for (int i = 0; devices && i < count; ++i) names.emplace_back(::ibv_get_device_name(devices[i]));
    if (devices) ::ibv_free_device_list(devices);
    return names;
  }

  /// Opens a device and port; `why` (if given) gets a readable reason on failure.
  static Result<std::unique_ptr<Device>> open(const DeviceOptions& options = {}, std::string* why = nullptr) {
    const auto fail = [why](std::error_code ec, std::string text) -> Result<std::unique_ptr<Device>> {
      if (why) *why = std::move(text);
      return ec;
    };
    int count = 0;
    std::unique_ptr<ibv_device*, void (*)(ibv_device**)> devices(::ibv_get_device_list(&count),
                                                                  &::ibv_free_device_list);
    if (!devices || count == 0) {
      return fail(RdmaErrc::noDevice, make_error_code(RdmaErrc::noDevice).message());
    }
    std::error_code last = std::make_error_code(std::errc::no_such_device);
    std::string lastWhy = "no RDMA device named '" + options.name + "'";
    for (int i = 0; i < count; ++i) {
      const std::string_view name = ::ibv_get_device_name(devices.get()[i]);
      if (!options.name.empty() && name != options.name) continue;
      std::unique_ptr<Device> device(new Device);
      Result<void> r = device->init(devices.get()[i], options.port, lastWhy);
      if (r) return device;
      last = r.error();
    }
    return fail(last, lastWhy);
  }

  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  /// The device's name (e.g. mlx5_0, rxe0).
  const std::string& name() const noexcept { return name_; }
  /// The verbs context.
  ibv_context* context() const noexcept { return context_.get(); }
  /// The protection domain every MemoryRegion and QueuePair on this Device uses.
  ibv_pd* protectionDomain() const noexcept { return pd_.get(); }
  /// The port used (1-based).
  std::uint8_t port() const noexcept { return port_; }
  /// The device's attributes (ibv_query_device).
  const ibv_device_attr& attributes() const noexcept { return deviceAttr_; }
  /// The port's attributes (ibv_query_port), as when opened.
  const ibv_port_attr& portAttributes() const noexcept { return portAttr_; }
  /// Ethernet (RoCE) or InfiniBand.
  bool isRoce() const noexcept { return portAttr_.link_layer == IBV_LINK_LAYER_ETHERNET; }
  /// The GID table index used as source GID (RoCE: never a zero or a
  /// link-local GID; RoCE v2 with an IPv4-mapped address first, then other
  /// RoCE v2 GIDs, then RoCE v1. InfiniBand: 0, addressing is by LID).
  std::uint32_t gidIndex() const noexcept { return gidIndex_; }
  /// The GID at gidIndex().
  const ibv_gid& gid() const noexcept { return gid_; }

  /// The device limits that QueuePairConfig is checked against.
  DeviceLimits limits() const noexcept {
    return DeviceLimits{static_cast<std::uint32_t>(deviceAttr_.max_qp_wr),
                        static_cast<std::uint32_t>(deviceAttr_.max_sge),
                        static_cast<std::uint32_t>(deviceAttr_.max_cqe),
                        static_cast<std::uint32_t>(deviceAttr_.max_qp_rd_atom),
                        static_cast<std::uint32_t>(deviceAttr_.max_qp_init_rd_atom),
                        portAttr_.max_msg_sz};
  }

 private:
  Device() = default;

  Result<void> init(ibv_device* device, std::uint8_t wantedPort, std::string& why) {
    name_ = ::ibv_get_device_name(device);
    context_.reset(::ibv_open_device(device));
    if (!context_) {
      why = "ibv_open_device(" + name_ + ") failed";
      return systemError(errno ? errno : ENODEV);
    }
    if (int rc = ::ibv_query_device(context_.get(), &deviceAttr_); rc != 0) {
      why = "ibv_query_device(" + name_ + ") failed";
      return systemError(rc);
    }
    const std::uint8_t first = wantedPort ? wantedPort : 1;
    const std::uint8_t last = wantedPort ? wantedPort : deviceAttr_.phys_port_cnt;
    port_ = 0;
    for (std::uint8_t p = first; p <= last && port_ == 0; ++p) {
      ibv_port_attr attr{};
      if (::ibv_query_port(context_.get(), p, &attr) == 0 && attr.state == IBV_PORT_ACTIVE) {
        port_ = p;
        portAttr_ = attr;
      }
    }
    if (port_ == 0) {
      why = "no ACTIVE port on " + name_;
      return RdmaErrc::noActivePort;
    }
    if (isRoce()) {
      std::vector<ibv_gid_entry> table(portAttr_.gid_tbl_len * deviceAttr_.phys_port_cnt + 1);
      const ssize_t n = ::ibv_query_gid_table(context_.get(), table.data(), table.size(), 0);
      if (n < 0) {
        why = "ibv_query_gid_table(" + name_ + ") failed";
        return systemError(static_cast<int>(-n));
      }
      table.resize(static_cast<std::size_t>(n));
      const std::optional<std::uint32_t> index = detail::selectRoceGid(table, port_);
      if (!index) {
        why = name_ + " port " + std::to_string(port_) + " has no usable RoCE GID";
        return RdmaErrc::noGid;
      }
      gidIndex_ = *index;
    }
    if (int rc = ::ibv_query_gid(context_.get(), port_, static_cast<int>(gidIndex_), &gid_); rc != 0) {
      why = "ibv_query_gid(" + name_ + ") failed";
      return systemError(rc < 0 ? -rc : rc);
    }
    pd_.reset(::ibv_alloc_pd(context_.get()));
    if (!pd_) {
      why = "ibv_alloc_pd(" + name_ + ") failed";
      return systemError(errno ? errno : ENOMEM);
    }
    return {};
  }

  struct CloseContext {
    void operator()(ibv_context* c) const noexcept { ::ibv_close_device(c); }
  };
  struct DeallocPd {
    void operator()(ibv_pd* p) const noexcept { ::ibv_dealloc_pd(p); }
  };

  std::string name_;
  // Declared before pd_: destroyed after it.
  std::unique_ptr<ibv_context, CloseContext> context_;
  std::unique_ptr<ibv_pd, DeallocPd> pd_;
  ibv_device_attr deviceAttr_{};
  ibv_port_attr portAttr_{};
  std::uint8_t port_ = 0;
  std::uint32_t gidIndex_ = 0;
  ibv_gid gid_{};
};

}  // namespace coio::rdma
