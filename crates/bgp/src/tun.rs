//! A TUN device that lives exactly as long as its file: the anchor of berth's routes.

use std::os::fd::AsRawFd;

use crate::Error;

/// `_IOW('T', 202, int)` from `<linux/if_tun.h>`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
/// `struct ifreq` as TUNSETIFF reads it: the name, then the flags, padded to 40 bytes.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Opens `/dev/net/tun` and attaches a new, non-persistent TUN device called `name` in the
/// current network namespace. Dropping the file deletes the device.
pub fn open_tun(name: &str) -> Result<std::fs::File, Error> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(|source| Error::Tun {
            name: name.to_string(),
            source,
        })?;
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ {
        return Err(Error::Tun {
            name: name.to_string(),
            source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        });
    }
    let mut request = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short,
        _pad: [0; 22],
    };
    request.name[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: the descriptor is open for the whole call and `request` is a valid, initialised
    // `struct ifreq` that outlives it; TUNSETIFF reads the name and flags and writes the name.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, &mut request) };
    if rc < 0 {
        return Err(Error::Tun {
            name: name.to_string(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(file)
}
