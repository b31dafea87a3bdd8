// Tests of megackpt/core/text.h: UTF-8 validation and escaping of file bytes
// shown in messages.
#include "megackpt/core/text.h"

#include <gtest/gtest.h>

#include <string>

namespace megackpt {
namespace {

TEST(Text, Utf8AndEscaping) {
  EXPECT_TRUE(IsValidUtf8("caf\xc3\xa9"));
  EXPECT_FALSE(IsValidUtf8("\xc3"));
  EXPECT_FALSE(IsValidUtf8("\xc0\x80"));          // overlong NUL
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_TRUE(IsValidUtf8(std::string("a\0b", 3)));
  EXPECT_FALSE(IsCleanText(std::string("a\0b", 3)));
  EXPECT_TRUE(IsCleanText("layers.0.w"));
  EXPECT_EQ(Quote(std::string("a\0b", 3)), "'a\\x00b'");
  EXPECT_EQ(Quote("\x1b[31mred"), "'\\x1b[31mred'");
  EXPECT_EQ(Quote("caf\xc3\xa9 \xff"), "'caf\xc3\xa9 \\xff'");
  EXPECT_EQ(Quote("it's\\"), "'it\\'s\\\\'");
  EXPECT_EQ(Quote("\xc2\x85"), "'\\xc2\\x85'");  // C1 control NEL
}

TEST(EscapeBytes, KeepsTextEscapesBytes) {
  EXPECT_EQ(EscapeBytes("layers.0.w"), "layers.0.w");
  EXPECT_EQ(EscapeBytes(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(EscapeBytes("tab\tnl\n\x1b[31m"), "tab\\tnl\\n\\x1b[31m");
  EXPECT_EQ(EscapeBytes("\xc3\xa9"), "\xc3\xa9");             // é stays
  EXPECT_EQ(EscapeBytes("\xff\xc3"), "\\xff\\xc3");           // malformed
  EXPECT_EQ(EscapeBytes("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(EscapeBytes("back\\slash"), "back\\\\slash");
  EXPECT_EQ(EscapeBytes(std::string(300, 'a'), 256).size(), 256u + 3);
  EXPECT_EQ(Quote(std::string("a\0b", 3)), "'a\\x00b'");
  EXPECT_TRUE(IsValidUtf8("\xf0\x9f\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // above U+10FFFF
}

}  // namespace
}  // namespace megackpt
