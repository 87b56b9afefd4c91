//! Raw block devices: sysfs and ioctls, claiming blank devices, reading their signature areas,
//! the full read of `verify: full`, and who writes to a device.

#[allow(unsafe_code)]
pub(crate) mod blockdev;
pub(crate) mod claims;
pub mod device_content;
pub mod verify;
pub(crate) mod writers;
