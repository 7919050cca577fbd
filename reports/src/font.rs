//! The font plots measure and rasterise text with, bundled so that no system font library or
//! installed font is needed (`fonts/README.md` says what it is and how it was made).

use plotters::style::{register_font, FontStyle};
use std::sync::Once;

static FONT: &[u8] = include_bytes!("../fonts/DejaVuSans-subset.ttf");

/// Makes the bundled font plotters' `sans-serif`; idempotent.
pub fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for style in [FontStyle::Normal, FontStyle::Bold] {
            // The font is a fixed, valid file (a unit test renders with it); failure here
            // would only mean text-less plots, never a crash.
            let _ = register_font("sans-serif", style, FONT);
        }
    });
}
