//! How each narrow format loads, widens to `f32` lanes, rounds back and stores, written once
//! over [`Lanes`] for both vector widths.

use super::Lanes;
use crate::element::narrow::{Format, E4M3, E5M2};
use crate::element::{bf16, f16, Element, F8E4M3, F8E5M2};
use std::marker::PhantomData;

/// Two vectors of `f32` lanes: the values one step of a kernel works on. Two per step let
/// bfloat16 widen and narrow with one operation per vector (its even and odd values), and
/// halve the loop overhead for the others.
pub(super) type Wide<C> = [<<C as Codec>::L as Lanes>::F; 2];
pub(super) type Masks<C> = [<<C as Codec>::L as Lanes>::M; 2];

/// `W` values of one type, as a kernel step loads and stores them.
pub(super) trait Step {
    type Elem: Element;
    /// `W` values in their own format.
    type Raw: Copy;
    const W: usize;
    unsafe fn load(p: *const Self::Elem) -> Self::Raw;
    unsafe fn store(p: *mut Self::Elem, r: Self::Raw);
}

/// A narrow type operated on in `f32` lanes.
pub(super) trait Codec: Step {
    type L: Lanes;
    /// Exact.
    unsafe fn widen(r: Self::Raw) -> Wide<Self>;
    /// Rounded as the type's portable `f32` conversion rounds.
    unsafe fn round(f: Wide<Self>) -> Self::Raw;
    /// `m ? t : f` per value; each given in both forms, for the codec to pick from.
    unsafe fn select(
        m: Masks<Self>,
        t: (Self::Raw, Wide<Self>),
        f: (Self::Raw, Wide<Self>),
    ) -> Self::Raw;
}

/// How bfloat16 values in `f32` lanes round back: the even values' vector and the odd
/// values', to `2N` bfloat16 values in order.
pub(super) trait Bf16Round<L: Lanes> {
    unsafe fn round(even: L::F, odd: L::F) -> L::I;
}

/// `narrow::bf16_from_f32` on whole vectors, with integer lane operations.
pub(super) struct IntRound;

impl<L: Lanes> Bf16Round<L> for IntRound {
    #[inline(always)]
    unsafe fn round(even: L::F, odd: L::F) -> L::I {
        L::join16(bf16_round::<L>(even), bf16_round::<L>(odd))
    }
}

/// `narrow::bf16_from_f32` on a whole vector, leaving the result in the high half of each lane
/// (where [`Lanes::join16`] takes it from).
#[inline(always)]
unsafe fn bf16_round<L: Lanes>(f: L::F) -> L::I {
    let b = L::bits(f);
    let odd = L::and(L::shr(b, 16), L::splat(1));
    let rounded = L::iadd(b, L::iadd(L::splat(0x7fff), odd));
    L::blend(L::is_nan(f), L::or(b, L::splat(0x0040_0000)), rounded)
}

/// NaN lanes replaced by the quiet NaN of the same sign, which F16C rounds to half's
/// canonical NaN (`0x7e00` with the sign), the portable path's NaN.
#[inline(always)]
unsafe fn quiet_nan<L: Lanes>(f: L::F) -> L::F {
    let b = L::bits(f);
    let canonical = L::or(L::and(b, L::splat(0x8000_0000)), L::splat(0x7fc0_0000));
    L::float(L::blend(L::is_nan(f), canonical, b))
}

/// `narrow::encode_f32` on a whole vector, for the 8-bit formats: the code in the low byte of
/// each lane.
#[inline(always)]
unsafe fn fp8_round<L: Lanes>(x: L::F, f: &Format) -> L::I {
    let u = L::bits(x);
    let abs = L::and(u, L::splat(0x7fff_ffff));
    let sign = L::and(L::shr(u, 31 - f.sign_shift), L::splat(1 << f.sign_shift));
    let shift = 23 - f.man;
    let odd = L::and(L::shr(abs, shift), L::splat(1));
    let rebias = ((127 - f.bias) as u32) << 23;
    let bias = ((1u32 << (shift - 1)) - 1).wrapping_sub(rebias);
    let normal = L::shr(L::iadd(L::iadd(abs, L::splat(bias)), odd), shift);
    let magic = ((1 - f.bias - f.man as i32 + 23 + 127) as u32) << 23;
    let sum = L::add(L::float(abs), L::float(L::splat(magic)));
    let sub = L::isub(L::bits(sum), L::splat(magic));
    let min_normal = L::splat(((1 - f.bias + 127) as u32) << 23);
    let mag = L::blend(L::gt(min_normal, abs), sub, normal);
    let overflow = L::gt(mag, L::splat(f.max_finite));
    let mag = L::blend(overflow, L::splat(f.overflow), mag);
    let mag = L::blend(L::is_nan(x), L::splat(f.nan), mag);
    L::or(mag, sign)
}

/// bfloat16, `2N` values per step: the even ones widen by a shift, the odd ones by masking off
/// their neighbour, so each `f32` vector costs one operation; `R` rounds back.
pub(super) struct Bf16<L, R = IntRound>(PhantomData<(L, R)>);

impl<L: Lanes, R> Step for Bf16<L, R> {
    type Elem = bf16;
    type Raw = L::I;
    const W: usize = 2 * L::N;
    #[inline(always)]
    unsafe fn load(p: *const bf16) -> L::I {
        L::load(p.cast())
    }
    #[inline(always)]
    unsafe fn store(p: *mut bf16, r: L::I) {
        L::store(p.cast(), r)
    }
}

impl<L: Lanes, R: Bf16Round<L>> Codec for Bf16<L, R> {
    type L = L;
    #[inline(always)]
    unsafe fn widen(r: L::I) -> [L::F; 2] {
        let odd = L::and(r, L::splat(0xffff_0000));
        [L::float(L::shl(r, 16)), L::float(odd)]
    }
    #[inline(always)]
    unsafe fn round(f: [L::F; 2]) -> L::I {
        R::round(f[0], f[1])
    }
    #[inline(always)]
    unsafe fn select(m: Masks<Self>, t: (L::I, Wide<Self>), f: (L::I, Wide<Self>)) -> L::I {
        // Widened bfloat16 is the value's bits shifted, so narrowing the choice is exact.
        L::join16(
            L::blend(m[0], L::bits(t.1[0]), L::bits(f.1[0])),
            L::blend(m[1], L::bits(t.1[1]), L::bits(f.1[1])),
        )
    }
}

/// A format F16C widens, `N` values (one `f32` vector) at a time.
pub(super) trait Half<L: Lanes> {
    type Elem: Element;
    /// `N` values in their own format.
    type R: Copy;
    unsafe fn load(p: *const u8) -> Self::R;
    unsafe fn store(p: *mut u8, r: Self::R);
    unsafe fn widen(r: Self::R) -> L::F;
    unsafe fn round(f: L::F) -> Self::R;
    unsafe fn select(m: L::M, t: Self::R, f: Self::R) -> Self::R;
}

/// A [`Half`] format, `2N` values per step; min and max pick the original bits, which keeps
/// signalling NaNs as they were.
pub(super) struct Halves<X, L>(PhantomData<(X, L)>);

impl<L: Lanes, X: Half<L>> Step for Halves<X, L> {
    type Elem = X::Elem;
    type Raw = [X::R; 2];
    const W: usize = 2 * L::N;
    #[inline(always)]
    unsafe fn load(p: *const X::Elem) -> [X::R; 2] {
        [X::load(p.cast()), X::load(p.add(L::N).cast())]
    }
    #[inline(always)]
    unsafe fn store(p: *mut X::Elem, r: [X::R; 2]) {
        X::store(p.cast(), r[0]);
        X::store(p.add(L::N).cast(), r[1]);
    }
}

impl<L: Lanes, X: Half<L>> Codec for Halves<X, L> {
    type L = L;
    #[inline(always)]
    unsafe fn widen(r: [X::R; 2]) -> [L::F; 2] {
        [X::widen(r[0]), X::widen(r[1])]
    }
    #[inline(always)]
    unsafe fn round(f: [L::F; 2]) -> [X::R; 2] {
        [X::round(f[0]), X::round(f[1])]
    }
    #[inline(always)]
    unsafe fn select(
        m: Masks<Self>,
        t: ([X::R; 2], Wide<Self>),
        f: ([X::R; 2], Wide<Self>),
    ) -> [X::R; 2] {
        [
            X::select(m[0], t.0[0], f.0[0]),
            X::select(m[1], t.0[1], f.0[1]),
        ]
    }
}

/// IEEE half: F16C both ways, NaN made canonical first.
pub(super) struct F16;

impl<L: Lanes> Half<L> for F16 {
    type Elem = f16;
    type R = L::H;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> L::H {
        L::load_h(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut u8, r: L::H) {
        L::store_h(p, r)
    }
    #[inline(always)]
    unsafe fn widen(r: L::H) -> L::F {
        L::cvtph(r)
    }
    #[inline(always)]
    unsafe fn round(f: L::F) -> L::H {
        L::cvtps_ph(quiet_nan::<L>(f))
    }
    #[inline(always)]
    unsafe fn select(m: L::M, t: L::H, f: L::H) -> L::H {
        L::blend_h(m, t, f)
    }
}

/// An 8-bit format: F16C after moving its fields into half's layout on the way in, the
/// integer rounding on the way out.
pub(super) trait Fp8Format<L: Lanes> {
    type Elem: Element;
    const FORMAT: &'static Format;
    unsafe fn widen(r: L::B) -> L::F;
}

/// The [`Half`] of an [`Fp8Format`].
pub(super) struct Fp8<X>(PhantomData<X>);

impl<L: Lanes, X: Fp8Format<L>> Half<L> for Fp8<X> {
    type Elem = X::Elem;
    type R = L::B;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> L::B {
        L::load_b(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut u8, r: L::B) {
        L::store_b(p, r)
    }
    #[inline(always)]
    unsafe fn widen(r: L::B) -> L::F {
        X::widen(r)
    }
    #[inline(always)]
    unsafe fn round(f: L::F) -> L::B {
        L::pack_b(fp8_round::<L>(f, X::FORMAT))
    }
    #[inline(always)]
    unsafe fn select(m: L::M, t: L::B, f: L::B) -> L::B {
        L::blend_b(m, t, f)
    }
}

/// E5M2 is the top byte of a half.
pub(super) struct E5m2;

impl<L: Lanes> Fp8Format<L> for E5m2 {
    type Elem = F8E5M2;
    const FORMAT: &'static Format = &E5M2;
    #[inline(always)]
    unsafe fn widen(r: L::B) -> L::F {
        L::cvtph(L::bytes_high(r))
    }
}

/// E4M3 goes through half's fields scaled by 2^-8 (see [`Lanes::e4m3_half`]), scaled back
/// exactly.
pub(super) struct E4m3;

impl<L: Lanes> Fp8Format<L> for E4m3 {
    type Elem = F8E4M3;
    const FORMAT: &'static Format = &E4M3;
    #[inline(always)]
    unsafe fn widen(r: L::B) -> L::F {
        L::mul(
            L::cvtph(L::e4m3_half(r)),
            L::float(L::splat(256f32.to_bits())),
        )
    }
}
