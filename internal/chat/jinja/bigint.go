package jinja

import (
	"errors"
	"fmt"
	"math"
	"math/big"
)

// Python integers have no size limit; values that do not fit int64 are
// *big.Int (never a *big.Int that fits: normInt keeps the int64 fast path
// for everything else).

// maxIntBits bounds integer results so a template cannot exhaust memory
// with 2 ** 10 ** 9.
const maxIntBits = 1 << 16

func normInt(b *big.Int) Value {
	if b.IsInt64() {
		return b.Int64()
	}
	return b
}

// asBig views an integer (bool, int64, *big.Int) as a big.Int.
func asBig(v Value) (*big.Int, bool) {
	switch x := v.(type) {
	case *big.Int:
		return x, true
	case int64:
		return big.NewInt(x), true
	case bool:
		if x {
			return big.NewInt(1), true
		}
		return big.NewInt(0), true
	}
	return nil, false
}

func isBig(v Value) bool {
	_, ok := v.(*big.Int)
	return ok
}

func bigToFloat(b *big.Int) float64 {
	f, _ := new(big.Float).SetInt(b).Float64()
	return f
}

// bigArith is integer arithmetic with Python semantics on big integers:
// floor division and modulo, negative powers as floats.
func bigArith(op string, a, b *big.Int) (Value, error) {
	out := new(big.Int)
	switch op {
	case "+":
		out.Add(a, b)
	case "-":
		out.Sub(a, b)
	case "*":
		if a.BitLen()+b.BitLen() > maxIntBits {
			return nil, fmt.Errorf("integer result larger than %d bits", maxIntBits)
		}
		out.Mul(a, b)
	case "**":
		if b.Sign() < 0 {
			return math.Pow(bigToFloat(a), bigToFloat(b)), nil
		}
		if a.BitLen() > 1 && (!b.IsInt64() || b.Int64() > maxIntBits/int64(a.BitLen()-1)) {
			return nil, fmt.Errorf("integer result larger than %d bits", maxIntBits)
		}
		out.Exp(a, b, nil)
	case "//", "%":
		if b.Sign() == 0 {
			return nil, errors.New("integer division or modulo by zero")
		}
		q, m := new(big.Int).QuoRem(a, b, new(big.Int))
		if m.Sign() != 0 && (m.Sign() < 0) != (b.Sign() < 0) {
			q.Sub(q, big.NewInt(1)) // floor division
			m.Add(m, b)
		}
		if op == "//" {
			return normInt(q), nil
		}
		return normInt(m), nil
	default:
		return nil, fmt.Errorf("unsupported integer operator %s", op)
	}
	return normInt(out), nil
}

// intArith is integer arithmetic on int64 operands, moving to big
// integers when the result would overflow.
func intArith(op string, a, b int64) (Value, error) {
	const half = 1 << 31
	switch op {
	case "+":
		if s := a + b; (a >= 0) == (b >= 0) && (s >= 0) != (a >= 0) {
			break // overflow
		} else {
			return s, nil
		}
	case "-":
		if s := a - b; (a >= 0) != (b >= 0) && (s >= 0) != (a >= 0) {
			break
		} else {
			return s, nil
		}
	case "*":
		if a > -half && a < half && b > -half && b < half {
			return a * b, nil
		}
	case "**":
		if b < 0 {
			return math.Pow(float64(a), float64(b)), nil
		}
	case "//", "%":
		if b == 0 {
			return nil, errors.New("integer division or modulo by zero")
		}
		if a == math.MinInt64 && b == -1 {
			break
		}
		q := a / b
		if (a%b != 0) && ((a < 0) != (b < 0)) {
			q-- // floor division
		}
		if op == "//" {
			return q, nil
		}
		return a - q*b, nil
	}
	return bigArith(op, big.NewInt(a), big.NewInt(b))
}
