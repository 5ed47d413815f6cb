//! The CUDA and NCCL test doubles as the workload's binaries load them: `dlopen` and `dlsym`, as
//! PyTorch loads libcuda. Shared by `ml-workload` and `ddp-rank`.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::path::Path;

pub type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
pub type CuLaunchKernel = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> c_int;
pub type CuStreamSynchronize = unsafe extern "C" fn(*mut c_void) -> c_int;
pub type NcclCommInitRank = unsafe extern "C" fn(*mut *mut c_void, c_int, *mut c_char, c_int) -> c_int;
pub type NcclAllReduce =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, *mut c_void, *mut c_void) -> c_int;

/// `dlopen` + `dlsym` of every function the loop calls.
pub struct Doubles {
    pub cu_init: CuInit,
    launch: CuLaunchKernel,
    sync: CuStreamSynchronize,
    comm_init: NcclCommInitRank,
    all_reduce: NcclAllReduce,
}

fn open(path: &Path) -> Result<*mut c_void, String> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: a valid NUL-terminated path; the handle is kept for the process's life.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns a static string or null.
        let why = unsafe { libc::dlerror() };
        let why = if why.is_null() {
            "unknown error".into()
        } else {
            // SAFETY: not null, so a NUL-terminated string owned by the C library.
            unsafe { std::ffi::CStr::from_ptr(why) }.to_string_lossy().into_owned()
        };
        return Err(format!("dlopen {}: {why}", path.display()));
    }
    Ok(handle)
}

fn symbol(handle: *mut c_void, name: &str) -> Result<*mut c_void, String> {
    let c = CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: a handle from dlopen and a valid symbol name.
    let ptr = unsafe { libc::dlsym(handle, c.as_ptr()) };
    if ptr.is_null() {
        return Err(format!("symbol {name} not found"));
    }
    Ok(ptr)
}

impl Doubles {
    pub fn load(dir: &Path) -> Result<Doubles, String> {
        let cuda = open(&dir.join("libcuda.so.1"))?;
        let nccl = open(&dir.join("libnccl.so.2"))?;
        // SAFETY: the symbols are the doubles' functions with exactly these C signatures.
        unsafe {
            Ok(Doubles {
                cu_init: std::mem::transmute::<*mut c_void, CuInit>(symbol(cuda, "cuInit")?),
                launch: std::mem::transmute::<*mut c_void, CuLaunchKernel>(symbol(cuda, "cuLaunchKernel")?),
                sync: std::mem::transmute::<*mut c_void, CuStreamSynchronize>(symbol(cuda, "cuStreamSynchronize")?),
                comm_init: std::mem::transmute::<*mut c_void, NcclCommInitRank>(symbol(nccl, "ncclCommInitRank")?),
                all_reduce: std::mem::transmute::<*mut c_void, NcclAllReduce>(symbol(nccl, "ncclAllReduce")?),
            })
        }
    }

    pub fn launch(&self, device_us: u32) {
        // SAFETY: the double reads no pointer argument.
        unsafe {
            (self.launch)(
                std::ptr::null_mut(),
                device_us,
                1,
                1,
                128,
                1,
                1,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            );
        }
    }

    pub fn synchronize(&self) {
        // SAFETY: the double ignores the stream.
        unsafe { (self.sync)(std::ptr::null_mut()) };
    }

    pub fn all_reduce(&self, send: &[f32], recv: &mut [f32], comm: *mut c_void) {
        // SAFETY: both buffers hold `send.len()` floats and outlive the call (it returns when
        // every rank has finished with them).
        unsafe {
            (self.all_reduce)(
                send.as_ptr().cast(),
                recv.as_mut_ptr().cast(),
                send.len().min(recv.len()),
                7,
                0,
                comm,
                std::ptr::null_mut(),
            )
        };
    }

    pub fn comm(&self, nranks: i32, rank: i32) -> Result<*mut c_void, String> {
        self.comm_with_id(nranks, rank, [0 as c_char; 128])
    }

    /// A communicator across processes: the double's ranks meet at a barrier in `file`, which
    /// every rank names the same (as every rank of a real job is given one `ncclUniqueId`).
    pub fn shared_comm(&self, nranks: i32, rank: i32, file: &Path) -> Result<*mut c_void, String> {
        let text = format!("file:{}", file.display());
        if text.len() >= 122 {
            return Err(format!("{}: the path is too long for an id", file.display()));
        }
        let mut id = [0 as c_char; 128];
        for (slot, byte) in id.iter_mut().zip(text.bytes()) {
            *slot = byte as c_char;
        }
        self.comm_with_id(nranks, rank, id)
    }

    /// An all-reduce of `count` floats on a communicator across processes, whose double reads
    /// and writes neither buffer (only the barrier and the transfer time count).
    pub fn shared_all_reduce(&self, count: usize, comm: *mut c_void) {
        let mut none = [0f32; 1];
        // SAFETY: in the cross-process mode the double touches neither buffer.
        unsafe {
            (self.all_reduce)(none.as_ptr().cast(), none.as_mut_ptr().cast(), count, 7, 0, comm, std::ptr::null_mut())
        };
    }

    fn comm_with_id(&self, nranks: i32, rank: i32, mut id: [c_char; 128]) -> Result<*mut c_void, String> {
        let mut comm = std::ptr::null_mut();
        // SAFETY: valid out-pointer and id buffer.
        let rc = unsafe { (self.comm_init)(&mut comm, nranks, id.as_mut_ptr(), rank) };
        if rc != 0 {
            return Err(format!("ncclCommInitRank failed: {rc}"));
        }
        Ok(comm)
    }
}
