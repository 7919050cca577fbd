//! Element arithmetic: the reduction kernels.
//!
//! Integer ops wrap (as NCCL's do on the GPU); float ops are plain IEEE operations. The loops
//! are written so the compiler vectorises them: the operator is chosen once outside the loop
//! and the body is a straight element-wise map.

use crate::dtype::{DataType, ReduceOp};

/// A type that can be reduced.
pub trait Element: Copy + Send + Sync + 'static + PartialOrd {
    const DTYPE: DataType;
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    /// Division by the rank count for `avg` (truncating for integers).
    fn div_n(self, n: usize) -> Self;
    /// Bits for bit-exact comparison.
    fn to_bits_u64(self) -> u64;
}

macro_rules! int_element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DataType = $d;
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn div_n(self, n: usize) -> Self {
                // n fits the type for any realistic job; if it does not, the average of
                // values of this width is 0 anyway.
                match <$t>::try_from(n) {
                    Ok(d) if d != 0 => self.wrapping_div(d),
                    _ => 0,
                }
            }
            #[inline(always)]
            fn to_bits_u64(self) -> u64 {
                self as u64 & (<$t>::MAX as u64 | (1u64 << (8 * std::mem::size_of::<$t>() - 1)))
            }
        }
    };
}

int_element!(i8, DataType::Int8);
int_element!(u8, DataType::Uint8);
int_element!(i32, DataType::Int32);
int_element!(u32, DataType::Uint32);
int_element!(i64, DataType::Int64);
int_element!(u64, DataType::Uint64);

macro_rules! float_element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DataType = $d;
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn div_n(self, n: usize) -> Self {
                self / (n as $t)
            }
            #[inline(always)]
            fn to_bits_u64(self) -> u64 {
                self.to_bits() as u64
            }
        }
    };
}

float_element!(f32, DataType::Float32);
float_element!(f64, DataType::Float64);

#[inline(always)]
fn min<T: Element>(a: T, b: T) -> T {
    if b < a {
        b
    } else {
        a
    }
}

#[inline(always)]
fn max<T: Element>(a: T, b: T) -> T {
    if b > a {
        b
    } else {
        a
    }
}

#[inline(always)]
fn map2<T: Element>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f(*d, *s);
    }
}

#[inline(always)]
fn map3<T: Element>(dst: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    for ((d, x), y) in dst.iter_mut().zip(a).zip(b) {
        *d = f(*x, *y);
    }
}

/// `dst = dst op src`. `Avg` accumulates a sum; the division happens once, in [`finish_avg`].
pub fn reduce_inplace<T: Element>(op: ReduceOp, dst: &mut [T], src: &[T]) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => map2(dst, src, T::add),
        ReduceOp::Prod => map2(dst, src, T::mul),
        ReduceOp::Min => map2(dst, src, min),
        ReduceOp::Max => map2(dst, src, max),
    }
}

/// `dst = a op b` (out-of-place: the local contribution stays untouched in the send buffer).
pub fn reduce_into<T: Element>(op: ReduceOp, dst: &mut [T], a: &[T], b: &[T]) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => map3(dst, a, b, T::add),
        ReduceOp::Prod => map3(dst, a, b, T::mul),
        ReduceOp::Min => map3(dst, a, b, min),
        ReduceOp::Max => map3(dst, a, b, max),
    }
}

/// The post-op of `Avg`: divide the reduced sum by the rank count.
pub fn finish_avg<T: Element>(dst: &mut [T], nranks: usize) {
    for d in dst.iter_mut() {
        *d = d.div_n(nranks);
    }
}

/// The value one reduction of `a` and `b` gives; the reference the kernels are checked against.
pub fn combine<T: Element>(op: ReduceOp, a: T, b: T) -> T {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => a.add(b),
        ReduceOp::Prod => a.mul(b),
        ReduceOp::Min => min(a, b),
        ReduceOp::Max => max(a, b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_match_scalar_reference() {
        let a: Vec<i8> = vec![100, -100, 7, 0, 127];
        let b: Vec<i8> = vec![100, -100, -8, 5, 1];
        for op in ReduceOp::ALL {
            let mut d = a.clone();
            reduce_inplace(op, &mut d, &b);
            let mut e = vec![0; a.len()];
            reduce_into(op, &mut e, &a, &b);
            let want: Vec<i8> = a.iter().zip(&b).map(|(x, y)| combine(op, *x, *y)).collect();
            assert_eq!(d, want, "{op}");
            assert_eq!(e, want, "{op}");
        }
        let mut s = vec![-7i32, 7, 9];
        finish_avg(&mut s, 2);
        assert_eq!(s, vec![-3, 3, 4], "integer avg truncates toward zero");
        assert_eq!(200u8.add(100), 44, "integer sum wraps");
        assert_eq!((-1i8).to_bits_u64(), 0xff);
        assert_eq!((-1i64).to_bits_u64(), u64::MAX);
    }
}
