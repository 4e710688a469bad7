/*
 * scripts/lab/mul_odd_check.c -- the f32 round-to-odd product of the fp8
 * widening (pa_mul_f32_odd, kernels/append.cu) against the double version it
 * replaced (pa_f64_to_f32_odd((double)x * s)), on the host: every code of
 * e4m3 and e5m2 (NaNs aside) times 3 million f32 scales (a million with random
 * bits, two million with random exponents). The GPU's __fmul_rz is modelled
 * by truncating the exact double product (x has at most 4 significant bits,
 * s 24: the product is exact in double).
 *   cc -O2 -o /tmp/mul_odd_check scripts/lab/mul_odd_check.c -lm && /tmp/mul_odd_check
 * (2026-12-06: 1510030872 checked, 0 differ)
 */
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

#include <stdlib.h>
static uint32_t fb(float f){uint32_t u;memcpy(&u,&f,4);return u;}
static float bf(uint32_t u){float f;memcpy(&f,&u,4);return f;}
static float rz64(double x){ float f=(float)x; if(isinf(x)) return (float)x; if(isinf(f)) return copysignf(bf(0x7f7fffff),(float)x); if(fabs((double)f)>fabs(x)) f=nextafterf(f,0.f); return f;}
static float odd64(double x){ float n=(float)x; if(isinf(n)||(double)n==x) return n; return bf(fb(rz64(x))|1u);}
static float mulrz(float x,float s){ return rz64((double)x*(double)s);}
static float odd32(float x,float s){ float r=mulrz(x,s), a=fabsf(r);
  if (x==0.f || (a>=bf(0x0d800000) && a<bf(0x7f7fffff))) return fmaf(x,s,-r)!=0.f? bf(fb(r)|1u) : r;
  return odd64((double)x*(double)s);}
static float e4m3(int b){int s=b&0x80,e=(b>>3)&15,m=b&7; float v; if(e==15&&m==7) v=NAN; else if(!e) v=m*0x1p-9f; else v=ldexpf(1+m/8.f,e-7); return s?-v:v;}
static float e5m2(int b){int s=b&0x80,e=(b>>2)&31,m=b&3; float v; if(e==31) v= m?NAN:INFINITY; else if(!e) v=m*0x1p-16f; else v=ldexpf(1+m/4.f,e-15); return s?-v:v;}
int main(){ uint64_t n=0,bad=0; srand(1);
  for(int it=0; it<3000000; it++){
    uint32_t su; if(it<1000000) su = ((uint32_t)rand()<<17) ^ (uint32_t)rand(); else { su = (uint32_t)rand() & 0x7fffff; su |= (uint32_t)(rand()%255)<<23; }
    su &= 0x7fffffff; float s=bf(su); if(!(s>0) || isinf(s)) continue;
    for(int b=0;b<256;b++) for(int f=0;f<2;f++){ float x = f? e5m2(b):e4m3(b); if(isnan(x)) continue;
      float a=odd32(x,s), c=odd64((double)x*(double)s); n++;
      if(fb(a)!=fb(c)){ if(bad<10) printf("x=%a s=%a got %a want %a\n",x,s,a,c); bad++; } } }
  printf("%llu checked, %llu differ\n",(unsigned long long)n,(unsigned long long)bad); }
