//! Element types and reduction operators, named as nccl-tests names them on the command line
//! and in the table, so that `-d` and `-o` values and the `type`/`redop` columns match.

use std::fmt;
use std::str::FromStr;

/// Element types. Order of [`DataType::ALL`] is nccl-tests' order for `-d all`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    Int8,
    Uint8,
    Int32,
    Uint32,
    Int64,
    Uint64,
    /// IEEE binary16, nccl-tests' `half`.
    Float16,
    Float32,
    Float64,
    BFloat16,
    /// OCP FP8 E4M3 (the finite-only "fn" variant CUDA implements).
    F8E4M3,
    /// OCP FP8 E5M2.
    F8E5M2,
}

impl DataType {
    pub const ALL: [DataType; 12] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::BFloat16,
        DataType::F8E4M3,
        DataType::F8E5M2,
    ];

    /// The name nccl-tests prints in the `type` column.
    pub fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Uint8 => "uint8",
            DataType::Int32 => "int32",
            DataType::Uint32 => "uint32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Float16 => "half",
            DataType::Float32 => "float",
            DataType::Float64 => "double",
            DataType::BFloat16 => "bfloat16",
            DataType::F8E4M3 => "f8e4m3",
            DataType::F8E5M2 => "f8e5m2",
        }
    }

    pub fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::F8E4M3 | DataType::F8E5M2 => 1,
            DataType::Float16 | DataType::BFloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(
            self,
            DataType::Float16
                | DataType::Float32
                | DataType::Float64
                | DataType::BFloat16
                | DataType::F8E4M3
                | DataType::F8E5M2
        )
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Error for an unknown `-d` or `-o` value; the message lists what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} '{value}'; expected one of: {expected}")]
pub struct ParseNameError {
    pub what: &'static str,
    pub value: String,
    pub expected: String,
}

impl FromStr for DataType {
    type Err = ParseNameError;
    /// Accepts nccl-tests' names and the short names NCCL, CUDA and the ML frameworks use
    /// (`fp16`, `bf16`, `e4m3`, ...), so a user need not remember which spelling this tool
    /// wants.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "int8" | "char" | "i8" => DataType::Int8,
            "uint8" | "u8" => DataType::Uint8,
            "int32" | "int" | "i32" => DataType::Int32,
            "uint32" | "u32" => DataType::Uint32,
            "int64" | "i64" => DataType::Int64,
            "uint64" | "u64" => DataType::Uint64,
            "float" | "float32" | "f32" => DataType::Float32,
            "double" | "float64" | "f64" => DataType::Float64,
            "half" | "float16" | "fp16" | "f16" => DataType::Float16,
            "bfloat16" | "bf16" => DataType::BFloat16,
            "f8e4m3" | "e4m3" | "fp8e4m3" | "fp8_e4m3" | "float8e4m3" | "float8_e4m3" => {
                DataType::F8E4M3
            }
            "f8e5m2" | "e5m2" | "fp8e5m2" | "fp8_e5m2" | "float8e5m2" | "float8_e5m2" => {
                DataType::F8E5M2
            }
            _ => {
                return Err(ParseNameError {
                    what: "data type",
                    value: s.to_string(),
                    expected: format!("{}, all", DataType::ALL.map(|d| d.name()).join(", ")),
                })
            }
        })
    }
}

/// Reduction operators. Order of [`ReduceOp::ALL`] is nccl-tests' order for `-o all`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Prod,
    Max,
    Min,
    /// Sum divided by the number of ranks (integer division for integer types).
    Avg,
    /// NCCL's PreMulSum as nccl-tests drives it: every rank multiplies its input by its own
    /// scalar ([`crate::element::premul_scalar`]) and the products are summed.
    MulSum,
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 6] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
        ReduceOp::MulSum,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
            ReduceOp::MulSum => "mulsum",
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = ParseNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "sum" => ReduceOp::Sum,
            "prod" => ReduceOp::Prod,
            "max" => ReduceOp::Max,
            "min" => ReduceOp::Min,
            "avg" => ReduceOp::Avg,
            "mulsum" | "premulsum" => ReduceOp::MulSum,
            _ => {
                return Err(ParseNameError {
                    what: "reduction op",
                    value: s.to_string(),
                    expected: format!("{}, all", ReduceOp::ALL.map(|o| o.name()).join(", ")),
                })
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DataType::ALL {
            assert_eq!(d.name().parse::<DataType>().unwrap(), d);
            assert_eq!(d.to_string(), d.name());
        }
        for o in ReduceOp::ALL {
            assert_eq!(o.name().parse::<ReduceOp>().unwrap(), o);
        }
        let e = "float7".parse::<DataType>().unwrap_err();
        assert!(e.to_string().contains("float7") && e.to_string().contains("double"));
        assert!(e.to_string().contains("f8e5m2"));
        assert!("mul".parse::<ReduceOp>().is_err());
        for (alias, d) in [
            ("float16", DataType::Float16),
            ("fp16", DataType::Float16),
            ("f16", DataType::Float16),
            ("bf16", DataType::BFloat16),
            ("e4m3", DataType::F8E4M3),
            ("fp8_e4m3", DataType::F8E4M3),
            ("e5m2", DataType::F8E5M2),
            ("fp8_e5m2", DataType::F8E5M2),
        ] {
            assert_eq!(alias.parse::<DataType>().unwrap(), d, "{alias}");
        }
    }

    /// `-d all` and `-o all` must walk the table in nccl-tests' order, or rows would not line
    /// up with an nccl-tests run for comparison.
    #[test]
    fn all_is_in_nccl_tests_order() {
        let names: Vec<_> = DataType::ALL.iter().map(|d| d.name()).collect();
        assert_eq!(
            names.join(" "),
            "int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2"
        );
        let sizes: Vec<_> = DataType::ALL.iter().map(|d| d.size()).collect();
        assert_eq!(sizes, [1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1]);
        let floats: Vec<_> = DataType::ALL.iter().map(|d| d.is_float()).collect();
        assert_eq!(
            floats,
            [false, false, false, false, false, false, true, true, true, true, true, true]
        );
        let ops: Vec<_> = ReduceOp::ALL.iter().map(|o| o.name()).collect();
        assert_eq!(ops.join(" "), "sum prod max min avg mulsum");
    }
}
