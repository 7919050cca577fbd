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
    Float32,
    Float64,
}

impl DataType {
    pub const ALL: [DataType; 8] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float32,
        DataType::Float64,
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
            DataType::Float32 => "float",
            DataType::Float64 => "double",
        }
    }

    pub fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 => 1,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DataType::Float32 | DataType::Float64)
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
    /// Accepts nccl-tests' names and NCCL's aliases (`ncclFloat32`-style short names).
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
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
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
        }
        for o in ReduceOp::ALL {
            assert_eq!(o.name().parse::<ReduceOp>().unwrap(), o);
        }
        let e = "float7".parse::<DataType>().unwrap_err();
        assert!(e.to_string().contains("float7") && e.to_string().contains("double"));
        assert!("mul".parse::<ReduceOp>().is_err());
    }
}
