//! Blueprint files read from the engine host by path (`--allow-path`).
//!
//! A path is checked in two steps. First on paper: resolved through symlinks as far as it
//! exists ([`resolve_existing`]) and compared with the roots, so every path outside them gets
//! the same answer whether or not it exists. Then the file is opened *beneath the root's
//! directory descriptor* (`openat2` with `RESOLVE_BENEATH`, or a component-by-component walk
//! with `O_NOFOLLOW` where `openat2` is missing), and size and type are read from the open
//! descriptor. The second step is what makes the check hold: a symlink swapped in between the
//! check and the open cannot lead out of the root, because the kernel refuses to leave it.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use super::{EngineError, Result};

/// Why a path source was not read.
#[derive(Debug, PartialEq)]
pub(super) enum Refused {
    /// Not under a root, on paper or when opened: callers give every such path one answer.
    Outside,
    /// Under a root but not readable as a blueprint (missing, not a regular file, too large).
    Invalid(EngineError),
}

/// The blueprint file a request names by `path` (relative to `cwd`): its resolved path and
/// bytes. Every path outside `roots` (canonical directories) gets the same `PermissionDenied`
/// whether it exists or not, so clients cannot probe the engine host; only inside a root may an
/// answer say a file is missing.
pub(super) fn read_source(
    path: &Path,
    cwd: &Path,
    roots: &[PathBuf],
    max: usize,
) -> Result<(PathBuf, Vec<u8>)> {
    // `join` keeps an absolute `path` as it is.
    read_under_roots(path, &cwd.join(path), roots, max).map_err(|r| match r {
        Refused::Outside => EngineError::PermissionDenied(format!(
            "{} is not under a root the engine allows (--allow-path); send the blueprint inline",
            path.display()
        )),
        Refused::Invalid(e) => e,
    })
}

/// Reads the absolute `path` (`shown` in messages as the request named it) when it lies under
/// one of `roots`: its resolved path and bytes.
pub(super) fn read_under_roots(
    shown: &Path,
    path: &Path,
    roots: &[PathBuf],
    max: usize,
) -> std::result::Result<(PathBuf, Vec<u8>), Refused> {
    read_with(shown, path, roots, max, Resolver::best())
}

fn read_with(
    shown: &Path,
    path: &Path,
    roots: &[PathBuf],
    max: usize,
    resolver: Resolver,
) -> std::result::Result<(PathBuf, Vec<u8>), Refused> {
    let resolved = resolve_existing(path).ok_or(Refused::Outside)?;
    let root = roots
        .iter()
        .find(|root| resolved.starts_with(root))
        .ok_or(Refused::Outside)?;
    let rel = resolved.strip_prefix(root).map_err(|_| Refused::Outside)?;
    let content = read_beneath(shown, root, rel, max, resolver)?;
    Ok((resolved, content))
}

/// Longer paths are refused before they are resolved (the kernel's own `PATH_MAX`): resolving
/// walks the path's prefixes, which must stay cheap whatever a request holds.
const MAX_PATH_BYTES: usize = 4096;

/// An absolute `path` resolved through symlinks as far as it exists, the rest appended as it is
/// (directories that do not exist hold no symlinks). `None` when the part that does not
/// exist climbs with `..` (the kernel cannot leave a missing directory, and doing it on paper
/// could step from there onto a symlink that leads out of a root), or when the path is longer
/// than [`MAX_PATH_BYTES`].
fn resolve_existing(path: &Path) -> Option<PathBuf> {
    if path.as_os_str().len() > MAX_PATH_BYTES {
        return None;
    }
    let parts: Vec<Component<'_>> = path.components().collect();
    for i in (1..=parts.len()).rev() {
        let prefix: PathBuf = parts[..i].iter().collect();
        if let Ok(real) = prefix.canonicalize() {
            let rest = &parts[i..];
            if rest.contains(&Component::ParentDir) {
                return None;
            }
            // `components()` has dropped every `.` inside an absolute path already. Pushed one
            // by one: joining an empty rest would add a trailing `/` to a file's path.
            let mut resolved = real;
            resolved.extend(rest);
            return Some(resolved);
        }
    }
    None
}

/// How a path is resolved beneath a root.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Resolver {
    /// `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`: symlinks are followed only while
    /// they stay beneath the root.
    Openat2,
    /// One `openat(O_NOFOLLOW)` per component: no symlink is followed at all (the path was
    /// resolved on paper already, so a symlink met now was put there since).
    Walk,
}

impl Resolver {
    fn best() -> Resolver {
        if cfg!(target_os = "linux") {
            Resolver::Openat2
        } else {
            Resolver::Walk
        }
    }
}

/// The bytes of `root/rel`, opened beneath `root` and refused, from the open descriptor,
/// when it is larger than `max` (`--max-input-size`) or not a regular file.
fn read_beneath(
    shown: &Path,
    root: &Path,
    rel: &Path,
    max: usize,
    resolver: Resolver,
) -> std::result::Result<Vec<u8>, Refused> {
    let invalid = |why: String| {
        Refused::Invalid(EngineError::InvalidArgument(format!(
            "{}: {why}",
            shown.display()
        )))
    };
    let too_large = |size: u64| {
        invalid(format!(
            "the file is {size} bytes, more than the engine's limit of {max} bytes \
             (--max-input-size, TRELLIS_MAX_INPUT_SIZE)"
        ))
    };
    let file = match open_beneath(root, rel, resolver) {
        Ok(file) => file,
        Err(Open::Escaped) => return Err(Refused::Outside),
        Err(Open::Io(e)) => return Err(invalid(e.to_string())),
    };
    let meta = file.metadata().map_err(|e| invalid(e.to_string()))?;
    if !meta.is_file() {
        return Err(invalid("not a regular file".into()));
    }
    if meta.len() > max as u64 {
        return Err(too_large(meta.len()));
    }
    let mut content = Vec::with_capacity(meta.len() as usize);
    // At most one byte past the limit: a file that grew since the check is refused too.
    file.take(max as u64 + 1)
        .read_to_end(&mut content)
        .map_err(|e| invalid(e.to_string()))?;
    if content.len() > max {
        return Err(too_large(content.len() as u64));
    }
    Ok(content)
}

#[derive(Debug)]
enum Open {
    /// Resolution would have left the root (a symlink swapped in since the check).
    Escaped,
    Io(io::Error),
}

impl From<io::Error> for Open {
    fn from(e: io::Error) -> Self {
        Open::Io(e)
    }
}

/// Flags of the final open: read-only, close-on-exec, and non-blocking so that a FIFO returns
/// at once (and is refused as not a regular file) instead of waiting for a writer.
const READ_FLAGS: libc::c_int =
    libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;

fn open_beneath(root: &Path, rel: &Path, resolver: Resolver) -> std::result::Result<File, Open> {
    let root_fd = open_at(
        libc::AT_FDCWD,
        root.as_os_str().as_bytes(),
        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
    )?;
    // Only plain names: `rel` is the rest of a resolved path below the root.
    let names: Vec<&[u8]> = rel
        .components()
        .map(|c| match c {
            Component::Normal(name) => Ok(name.as_bytes()),
            _ => Err(Open::Escaped),
        })
        .collect::<std::result::Result<_, _>>()?;
    if resolver == Resolver::Openat2 {
        match openat2_beneath(&root_fd, &names) {
            Err(Open::Io(e)) if openat2_unavailable(&e) => {}
            other => return other,
        }
    }
    walk_beneath(root_fd, &names)
}

/// `openat2` is missing (kernels before 5.6), filtered (seccomp profiles answer `EPERM` or
/// `ENOSYS`) or does not know a flag: the walk is used instead.
fn openat2_unavailable(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSYS | libc::EPERM | libc::E2BIG | libc::EINVAL)
    )
}

#[cfg(target_os = "linux")]
fn openat2_beneath(root: &OwnedFd, names: &[&[u8]]) -> std::result::Result<File, Open> {
    /// `struct open_how` of linux/openat2.h (libc's is `non_exhaustive`).
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let joined = if names.is_empty() {
        b".".to_vec()
    } else {
        names.join(&b'/')
    };
    let path = CString::new(joined).map_err(|_| Open::Io(io::ErrorKind::InvalidInput.into()))?;
    let how = OpenHow {
        flags: READ_FLAGS as u64,
        mode: 0,
        resolve: libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS,
    };
    // The kernel answers EAGAIN when a rename raced the lookup; a few tries settle it.
    for _ in 0..8 {
        // SAFETY: a valid directory descriptor, a NUL-terminated path and an `open_how` of the
        // size passed; the returned descriptor is owned below.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                root.as_raw_fd(),
                path.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        if fd >= 0 {
            // SAFETY: a descriptor the kernel just returned to us and nobody else owns.
            return Ok(unsafe { File::from_raw_fd(fd as RawFd) });
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) => continue,
            // The path climbed out of the root or crossed an absolute or magic link.
            Some(libc::EXDEV | libc::ELOOP) => return Err(Open::Escaped),
            _ => return Err(Open::Io(e)),
        }
    }
    Err(Open::Io(io::ErrorKind::WouldBlock.into()))
}

#[cfg(not(target_os = "linux"))]
fn openat2_beneath(_root: &OwnedFd, _names: &[&[u8]]) -> std::result::Result<File, Open> {
    Err(Open::Io(io::Error::from_raw_os_error(libc::ENOSYS)))
}

/// Opens `names` one by one from `root`, following no symlink. A symlink met on the way is
/// `Escaped`: the path had none when it was resolved, so it was swapped in since.
fn walk_beneath(root: OwnedFd, names: &[&[u8]]) -> std::result::Result<File, Open> {
    let Some((last, dirs)) = names.split_last() else {
        return Ok(File::from(open_at(root.as_raw_fd(), b".", READ_FLAGS)?));
    };
    let mut dir = root;
    for name in dirs {
        let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        dir = match open_at(dir.as_raw_fd(), name, flags) {
            Ok(fd) => fd,
            Err(e) => return Err(symlink_or(&dir, name, e)),
        };
    }
    match open_at(dir.as_raw_fd(), last, READ_FLAGS | libc::O_NOFOLLOW) {
        Ok(fd) => Ok(File::from(fd)),
        Err(e) => Err(symlink_or(&dir, last, e)),
    }
}

/// `e` from opening `dir/name` with `O_NOFOLLOW`: `Escaped` when `name` is a symlink (the
/// kernel says `ELOOP` or `ENOTDIR` for one), else the error itself.
fn symlink_or(dir: &OwnedFd, name: &[u8], e: io::Error) -> Open {
    if !matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) {
        return Open::Io(e);
    }
    let Ok(c) = CString::new(name) else {
        return Open::Io(e);
    };
    // SAFETY: `stat` is plain data, filled in by the kernel.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid directory descriptor, a NUL-terminated name and a `stat` to fill.
    let rc = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFLNK {
        Open::Escaped
    } else {
        Open::Io(e)
    }
}

fn open_at(dir: RawFd, name: &[u8], flags: libc::c_int) -> io::Result<OwnedFd> {
    let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `dir` is a directory descriptor (or AT_FDCWD) and `c` is NUL-terminated.
    let fd = unsafe { libc::openat(dir, c.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just returned to us and nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir::TestDir;

    #[test]
    fn paths_outside_the_roots_are_denied_alike_whether_they_exist_or_not() {
        let tmp = TestDir::new("paths");
        let root = tmp.join("root");
        let outside = tmp.join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(root.join("app.yaml"), "x").unwrap();
        std::fs::write(outside.join("secret.yaml"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("out")).unwrap();
        std::os::unix::fs::symlink(&root, outside.join("in")).unwrap();
        let roots = [root.clone()];
        let check = |p: &Path| read_source(p, &tmp, &roots, 100);

        // Each pair: an existing file and a missing one, reached the same way.
        let outside_paths = [
            outside.join("secret.yaml"),
            outside.join("missing.yaml"),
            root.join("../outside/secret.yaml"),
            root.join("../outside/missing.yaml"),
            root.join("out/secret.yaml"),
            root.join("out/missing.yaml"),
            root.join("out/nowhere/../../outside/secret.yaml"),
            // Up out of a directory that does not exist, onto a symlink leading out.
            root.join("nope/../out/secret.yaml"),
            root.join("nope/../out/missing.yaml"),
            // Up out of a missing directory, even when it would land inside.
            root.join("x/../app.yaml"),
            root.join(format!("{}/app.yaml", "a/".repeat(3000))),
            PathBuf::from("outside/secret.yaml"),
            PathBuf::from("outside/missing.yaml"),
            PathBuf::from("/"),
        ];
        for p in &outside_paths {
            assert_eq!(
                check(p),
                Err(EngineError::PermissionDenied(format!(
                    "{} is not under a root the engine allows (--allow-path); send the \
                     blueprint inline",
                    p.display()
                ))),
                "{}",
                p.display()
            );
        }

        // Inside a root: found, through `..` and symlinks that stay inside, or said missing.
        let app = root.join("app.yaml");
        let found = Ok((app.clone(), b"x".to_vec()));
        assert_eq!(check(&root.join("app.yaml")), found);
        assert_eq!(check(Path::new("root/./app.yaml")), found);
        assert_eq!(check(&outside.join("in/./app.yaml")), found);
        assert_eq!(check(&outside.join("in/app.yaml")), found);
        assert!(matches!(
            check(&root.join("missing.yaml")),
            Err(EngineError::InvalidArgument(m)) if m.contains("No such file")
        ));
        assert!(matches!(
            check(&root.join("app.yaml/below")),
            Err(EngineError::InvalidArgument(m)) if m.contains("Not a directory")
        ));

        // No roots: nothing is readable.
        assert!(matches!(
            read_source(&root.join("app.yaml"), &tmp, &[], 100),
            Err(EngineError::PermissionDenied(_))
        ));
    }

    #[test]
    fn path_sources_larger_than_the_input_limit_are_refused() {
        let tmp = TestDir::new("size");
        let roots = [tmp.to_path_buf()];
        let file = tmp.join("big.yaml");
        std::fs::write(&file, vec![b'#'; 11]).unwrap();
        assert_eq!(read_source(&file, &tmp, &roots, 11).unwrap().1.len(), 11);
        let err = read_source(Path::new("big.yaml"), &tmp, &roots, 10).unwrap_err();
        assert_eq!(
            err,
            EngineError::InvalidArgument(
                "big.yaml: the file is 11 bytes, more than the engine's limit of 10 bytes \
                 (--max-input-size, TRELLIS_MAX_INPUT_SIZE)"
                    .into()
            )
        );
        // Not a file: refused without blocking (a FIFO has no writer here).
        assert!(matches!(
            read_source(&tmp, &tmp, &roots, 10),
            Err(EngineError::InvalidArgument(m)) if m.ends_with("not a regular file")
        ));
        let fifo = tmp.join("fifo");
        let c = CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            read_source(&fifo, &tmp, &roots, 10),
            Err(EngineError::InvalidArgument(m)) if m.ends_with("not a regular file")
        ));
    }

    /// Both resolvers refuse symlinks out of the root, relative (`..`) or absolute, even when
    /// asked to open them directly (as after a swap that the check did not see).
    #[test]
    fn opening_beneath_a_root_never_follows_a_symlink_out_of_it() {
        let tmp = TestDir::new("beneath");
        let root = tmp.join("root");
        let outside = tmp.join("outside");
        std::fs::create_dir_all(root.join("dir")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(root.join("dir/app.yaml"), "inside").unwrap();
        std::fs::write(outside.join("secret.yaml"), "SECRET").unwrap();
        let link = |target: &Path, name: &str| {
            std::os::unix::fs::symlink(target, root.join(name)).unwrap();
        };
        link(Path::new("../outside/secret.yaml"), "dotdot.yaml");
        link(&outside.join("secret.yaml"), "absolute.yaml");
        link(Path::new(".."), "up");
        link(&outside, "absdir");
        link(Path::new("/proc/self/root"), "magic");
        link(Path::new("dir/app.yaml"), "staying.yaml");
        for resolver in [Resolver::Openat2, Resolver::Walk] {
            for rel in [
                "dotdot.yaml",
                "absolute.yaml",
                "up/outside/secret.yaml",
                "absdir/secret.yaml",
                "magic/etc/hostname",
            ] {
                assert_eq!(
                    read_beneath(Path::new(rel), &root, Path::new(rel), 100, resolver),
                    Err(Refused::Outside),
                    "{resolver:?} {rel}"
                );
            }
            assert_eq!(
                read_beneath(
                    Path::new("x"),
                    &root,
                    Path::new("dir/app.yaml"),
                    100,
                    resolver
                ),
                Ok(b"inside".to_vec()),
                "{resolver:?}"
            );
        }
        // A symlink that stays beneath the root is followed by openat2 only (the walk follows
        // none: the paper check resolved them all before).
        assert_eq!(
            read_beneath(
                Path::new("x"),
                &root,
                Path::new("staying.yaml"),
                100,
                Resolver::Openat2
            ),
            Ok(b"inside".to_vec())
        );
        // Through the public entry, each is the same refusal as any other outside path.
        for name in [
            "dotdot.yaml",
            "absolute.yaml",
            "up/outside/secret.yaml",
            "absdir/secret.yaml",
        ] {
            assert!(
                matches!(
                    read_source(&root.join(name), &tmp, std::slice::from_ref(&root), 100),
                    Err(EngineError::PermissionDenied(_))
                ),
                "{name}"
            );
        }
    }

    /// A thread swaps a directory and a file inside the root with symlinks out of it (atomic
    /// `RENAME_EXCHANGE`) while the engine reads them over and over: whatever the interleaving
    /// between the check and the open, the outside content never comes back.
    #[test]
    fn a_symlink_swapped_in_after_the_check_never_leads_out_of_the_root() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};

        let tmp = TestDir::new("race");
        let root = tmp.join("root");
        let outside = tmp.join("outside");
        std::fs::create_dir_all(root.join("dir")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(root.join("dir/app.yaml"), "inside").unwrap();
        std::fs::write(root.join("app.yaml"), "inside").unwrap();
        std::fs::write(outside.join("app.yaml"), "SECRET").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("dir.swap")).unwrap();
        std::os::unix::fs::symlink(outside.join("app.yaml"), root.join("app.yaml.swap")).unwrap();
        let c = |p: PathBuf| CString::new(p.as_os_str().as_bytes()).unwrap();
        let pairs = [
            (c(root.join("dir")), c(root.join("dir.swap"))),
            (c(root.join("app.yaml")), c(root.join("app.yaml.swap"))),
        ];
        // Stops the flipper however the test ends, before the directory goes.
        struct Stop(Arc<AtomicBool>);
        impl Drop for Stop {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let stop = Stop(Arc::new(AtomicBool::new(false)));
        let flipper = {
            let stop = stop.0.clone();
            std::thread::spawn(move || -> io::Result<u64> {
                let mut swaps = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for (a, b) in &pairs {
                        // SAFETY: two NUL-terminated paths.
                        let rc = unsafe {
                            libc::renameat2(
                                libc::AT_FDCWD,
                                a.as_ptr(),
                                libc::AT_FDCWD,
                                b.as_ptr(),
                                libc::RENAME_EXCHANGE,
                            )
                        };
                        if rc != 0 {
                            return Err(io::Error::last_os_error());
                        }
                        swaps += 1;
                    }
                }
                Ok(swaps)
            })
        };
        let roots = [root.clone()];
        let mut read = 0;
        for _ in 0..1500 {
            for resolver in [Resolver::Openat2, Resolver::Walk] {
                for name in ["dir/app.yaml", "app.yaml"] {
                    let path = root.join(name);
                    match read_with(&path, &path, &roots, 100, resolver) {
                        Ok((_, content)) => {
                            assert_eq!(
                                String::from_utf8_lossy(&content),
                                "inside",
                                "{resolver:?} read {name} outside the root"
                            );
                            read += 1;
                        }
                        Err(
                            Refused::Outside | Refused::Invalid(EngineError::InvalidArgument(_)),
                        ) => {}
                        Err(e) => panic!("{name}: {e:?}"),
                    }
                }
            }
        }
        drop(stop);
        let swaps = flipper.join().unwrap().expect("RENAME_EXCHANGE");
        eprintln!("{read} reads inside, {swaps} swaps");
    }
}
