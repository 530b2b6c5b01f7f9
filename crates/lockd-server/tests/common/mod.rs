//! The shared test kit's in-process clusters (`lockd_testkit::inproc`), as every test file
//! here imports them.
#![allow(unused_imports)]

pub use lockd_testkit::inproc::*;
