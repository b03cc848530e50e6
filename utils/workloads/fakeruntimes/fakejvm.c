// A fake libjvm.so: the tables the HotSpot unwinder reads (vmStructs, as
// the serviceability agent finds them), over random bytes filled at load
// time, and a function that only spins. Loaded by fakeruntimes.c.
#include <stdint.h>
#include <stdio.h>

static unsigned char noise[1 << 16];

// Pointers to the tables, and the tables' strides and offsets: random.
void *gHotSpotVMStructs, *gHotSpotVMTypes, *gHotSpotVMIntConstants, *gHotSpotVMLongConstants;
uint64_t gHotSpotVMStructEntryArrayStride, gHotSpotVMStructEntryTypeNameOffset,
  gHotSpotVMStructEntryFieldNameOffset, gHotSpotVMStructEntryTypeStringOffset,
  gHotSpotVMStructEntryIsStaticOffset, gHotSpotVMStructEntryOffsetOffset,
  gHotSpotVMStructEntryAddressOffset, gHotSpotVMTypeEntryArrayStride,
  gHotSpotVMTypeEntryTypeNameOffset, gHotSpotVMTypeEntrySizeOffset,
  gHotSpotVMIntConstantEntryArrayStride, gHotSpotVMIntConstantEntryNameOffset,
  gHotSpotVMIntConstantEntryValueOffset, gHotSpotVMLongConstantEntryArrayStride,
  gHotSpotVMLongConstantEntryNameOffset, gHotSpotVMLongConstantEntryValueOffset;

static volatile unsigned long sink;

__attribute__((noinline)) void JVM_Spin(void)
{
  for (int i = 0; i < 1000000; i++)
    sink += (unsigned long)i * i;
}

__attribute__((constructor)) static void fill(void)
{
  FILE *f = fopen("/dev/urandom", "r");
  if (!f)
    return;
  fread(noise, 1, sizeof(noise), f);
  uint64_t *words[] = {
    &gHotSpotVMStructEntryArrayStride,      &gHotSpotVMStructEntryTypeNameOffset,
    &gHotSpotVMStructEntryFieldNameOffset,  &gHotSpotVMStructEntryTypeStringOffset,
    &gHotSpotVMStructEntryIsStaticOffset,   &gHotSpotVMStructEntryOffsetOffset,
    &gHotSpotVMStructEntryAddressOffset,    &gHotSpotVMTypeEntryArrayStride,
    &gHotSpotVMTypeEntryTypeNameOffset,     &gHotSpotVMTypeEntrySizeOffset,
    &gHotSpotVMIntConstantEntryArrayStride, &gHotSpotVMIntConstantEntryNameOffset,
    &gHotSpotVMIntConstantEntryValueOffset, &gHotSpotVMLongConstantEntryArrayStride,
    &gHotSpotVMLongConstantEntryNameOffset, &gHotSpotVMLongConstantEntryValueOffset};
  for (unsigned i = 0; i < sizeof(words) / sizeof(words[0]); i++)
    fread(words[i], sizeof(uint64_t), 1, f);
  fclose(f);
  gHotSpotVMStructs = noise;
  gHotSpotVMTypes = noise + 4096;
  gHotSpotVMIntConstants = noise + 8192;
  gHotSpotVMLongConstants = noise + 12288;
}
