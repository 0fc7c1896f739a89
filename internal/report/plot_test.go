package report

import (
	"bytes"
	"encoding/xml"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// svgBox is a rectangle in the SVG's viewport (y grows downwards).
type svgBox struct{ X0, Y0, X1, Y1 float64 }

type svgText struct {
	Text string
	Box  svgBox
	Rot  bool // drawn rotated (the y axis title)
}

type svgPath struct {
	Pts  [][2]float64 // viewport coordinates
	Fill string       // "" when not filled
	Ink  bool         // black stroke: axes and tick marks
}

type svgGeom struct {
	W, H  float64
	Texts []svgText
	Paths []svgPath
}

var (
	svgNum      = regexp.MustCompile(`-?[0-9.]+(?:e[-+]?[0-9]+)?`)
	svgFontSize = regexp.MustCompile(`font-size:([0-9.]+)px`)
	svgFill     = regexp.MustCompile(`fill:(#[0-9A-Fa-f]{6})`)
)

// Estimated text extents, in em, of a wide sans serif (DejaVu Sans: digits
// are 0.64 em wide): what a browser without Liberation Sans or Arial shows.
const (
	estRuneWidth = 0.6
	estAscent    = 0.75
	estDescent   = 0.25
)

// parseSVG reads the geometry of gonum's SVG: a page flipped by
// "scale(1, -1) translate(0, -H)", texts flipped back by "scale(1, -1)",
// the y axis title inside "rotate(90)".
func parseSVG(t *testing.T, b []byte) svgGeom {
	t.Helper()
	var g svgGeom
	dec := xml.NewDecoder(bytes.NewReader(b))
	var rot []bool
	attr := func(se xml.StartElement, name string) string {
		for _, a := range se.Attr {
			if a.Name.Local == name {
				return a.Value
			}
		}
		return ""
	}
	num := func(s string) float64 {
		v, err := strconv.ParseFloat(s, 64)
		require.NoError(t, err, s)
		return v
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		switch se := tok.(type) {
		case xml.StartElement:
			switch se.Name.Local {
			case "svg":
				vb := strings.Fields(attr(se, "viewBox"))
				require.Len(t, vb, 4)
				g.W, g.H = num(vb[2]), num(vb[3])
			case "g":
				rot = append(rot, strings.Contains(attr(se, "transform"), "rotate(90)"))
			case "path":
				p := svgPath{Ink: strings.Contains(attr(se, "style"), "stroke:#000000")}
				if m := svgFill.FindStringSubmatch(attr(se, "style")); m != nil {
					p.Fill = m[1]
				}
				d := attr(se, "d")
				if strings.ContainsAny(d, "ACQacq") {
					continue // point markers: circles drawn with arcs
				}
				ns := svgNum.FindAllString(d, -1)
				for i := 0; i+1 < len(ns); i += 2 {
					p.Pts = append(p.Pts, [2]float64{num(ns[i]), g.H - num(ns[i+1])})
				}
				g.Paths = append(g.Paths, p)
			case "text":
				var s string
				require.NoError(t, dec.DecodeElement(&s, &se))
				m := svgFontSize.FindStringSubmatch(attr(se, "style"))
				require.NotNil(t, m, "font size of %q", s)
				size, x, y := num(m[1]), num(attr(se, "x")), num(attr(se, "y"))
				w := float64(utf8.RuneCountInString(s)) * estRuneWidth * size
				st := svgText{Text: s, Rot: len(rot) > 0 && rot[len(rot)-1]}
				if st.Rot {
					// Reads upwards from (y, H-x); its ascent points left.
					st.Box = svgBox{y - estAscent*size, g.H - x - w, y + estDescent*size, g.H - x}
				} else {
					by := g.H + y
					st.Box = svgBox{x, by - estAscent*size, x + w, by + estDescent*size}
				}
				g.Texts = append(g.Texts, st)
			}
		case xml.EndElement:
			if se.Name.Local == "g" && len(rot) > 0 {
				rot = rot[:len(rot)-1]
			}
		}
	}
	require.NotZero(t, g.W)
	return g
}

// yAxis is the longest vertical black line: its x, top and bottom.
func (g svgGeom) yAxis() (x, top, bottom float64) {
	best := -1.0
	for _, p := range g.Paths {
		if !p.Ink || len(p.Pts) != 2 || p.Pts[0][0] != p.Pts[1][0] {
			continue
		}
		if l := math.Abs(p.Pts[0][1] - p.Pts[1][1]); l > best {
			best, x = l, p.Pts[0][0]
			top, bottom = math.Min(p.Pts[0][1], p.Pts[1][1]), math.Max(p.Pts[0][1], p.Pts[1][1])
		}
	}
	return x, top, bottom
}

func TestRenderSVGKeepsTextAndDataInside(t *testing.T) {
	steps := func(n int, f func(i int) float64) series {
		s := series{Name: "s"}
		for i := 1; i <= n; i++ {
			s.X = append(s.X, float64(i))
			s.Y = append(s.Y, f(i))
		}
		return s
	}
	big := steps(5000, func(i int) float64 { return 1e6 * (1 + math.Sin(float64(i)/100)) })
	band := steps(4, func(i int) float64 { return 0.01 * float64(i) })
	band.Std = []float64{0.03, 0.02, 0.01, 0.02}
	tests := []chart{
		{ID: "big", Title: "Gradient norm (before clipping)", YLabel: "norm", Series: []series{big}},
		{ID: "band", Title: "Reward (mean ± std over the step's rollouts)", YLabel: "reward", Series: []series{band}},
		{ID: "negative", Title: "Loss", YLabel: "loss", Series: []series{steps(5000, func(i int) float64 { return -1234.5 * math.Cos(float64(i)/500) })}},
		{ID: "narrow", Title: "Entropy", YLabel: "nats per token", Series: []series{steps(4, func(i int) float64 { return 5.7521 + 1e-4*float64(i%3) })}},
		{ID: "tiny", Title: "Learning rate", YLabel: "lr", Series: []series{steps(4000, func(i int) float64 { return 1e-6 * (1 - float64(i)/5000) })}},
		{ID: "bars", Title: "Rollout outcomes per step", YLabel: "rollouts", Kind: chartStacked, Series: []series{
			steps(4, func(i int) float64 { return float64(i) }), steps(4, func(i int) float64 { return 30 - float64(i) + float64(i%2) })}},
		{ID: "many-bars", Title: "Time per step by phase", YLabel: "seconds", Kind: chartStacked, Series: []series{
			steps(5000, func(i int) float64 { return 200 + float64(i%7) }), steps(5000, func(int) float64 { return 100 })}},
		{ID: "one-step", Title: "Reward", YLabel: "reward", Series: []series{steps(1, func(int) float64 { return 0.5 })}},
	}
	for _, c := range tests {
		t.Run(c.ID, func(t *testing.T) {
			b, err := renderSVG(c)
			require.NoError(t, err)
			g := parseSVG(t, b)
			axisX, axisTop, axisBottom := g.yAxis()
			require.Positive(t, axisX)
			tickLeft := axisX
			for _, p := range g.Paths {
				if p.Ink && len(p.Pts) == 2 && p.Pts[0][1] == p.Pts[1][1] && math.Max(p.Pts[0][0], p.Pts[1][0]) == axisX {
					tickLeft = math.Min(tickLeft, math.Min(p.Pts[0][0], p.Pts[1][0]))
				}
			}
			require.Less(t, tickLeft, axisX, "y tick marks")
			for _, tx := range g.Texts {
				bx := tx.Box
				assert.True(t, bx.X0 >= 0 && bx.Y0 >= 0 && bx.X1 <= g.W && bx.Y1 <= g.H,
					"%q at %+v is not inside the %gx%g view box", tx.Text, bx, g.W, g.H)
				if !tx.Rot && bx.X0 < axisX && bx.Y1 < axisBottom+10 && tx.Text != c.Title {
					assert.LessOrEqual(t, bx.X1, tickLeft, "y tick label %q runs into the axis", tx.Text)
				}
				if tx.Text == c.Title {
					assert.LessOrEqual(t, bx.Y1, axisTop, "title overlaps the plot")
				}
			}
			// Filled shapes (bars, std bands) stay below the top of the
			// y axis, with room to spare; the white page is not one.
			filled, highest := 0, math.Inf(1)
			for _, p := range g.Paths {
				if p.Fill == "" || strings.EqualFold(p.Fill, "#FFFFFF") {
					continue
				}
				filled++
				for _, pt := range p.Pts {
					highest = math.Min(highest, pt[1])
				}
			}
			if c.Kind == chartStacked || c.Series[0].Std != nil {
				require.Positive(t, filled, "bars or bands drawn")
				assert.Greater(t, highest, axisTop+1, "a bar or band reaches the top of the plot")
			}
		})
	}
}
