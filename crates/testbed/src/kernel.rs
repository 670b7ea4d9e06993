//! What the running kernel can do, so kernel tests can declare what they need.
//! (Owned by the guest-kernel harness work.)
